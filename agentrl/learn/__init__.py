"""TrajectoryGroups to gradient steps: the typed Batch, advantages and credit assignment, the learner, and the loss registry. Uses only agentrl.core and agentrl.compute."""
