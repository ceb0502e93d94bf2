"""The agentrl command line (train, eval, check, doctor, view, envs, losses) on top of every side."""
