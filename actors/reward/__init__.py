"""The reward actor: checks and scores delivered episodes (rule scorers or a judge model) and passes them on to replay."""
