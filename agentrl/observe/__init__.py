"""What a run shows: the run log and trackers, plots, and the trajectory viewer. Uses only agentrl.core and agentrl.compute."""
