"""The league actor: a population of policies and frozen snapshots, matchmaking and ratings."""
