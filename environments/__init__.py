"""Built-in environments (installed as ``agentrl.environments``)."""
