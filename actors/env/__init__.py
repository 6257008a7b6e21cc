"""The env actor: plays episodes against the policy, admits them under the staleness bound, delivers them to the reward actor."""
