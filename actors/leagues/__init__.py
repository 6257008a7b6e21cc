"""The league's domain: matchmaking (who plays whom, when a member is frozen) and the league table."""
