"""What users write against: environments, rewards, tools and their dispatch, the sandbox, the registry and check_env. Imports only agentrl.core: no tokens, models or training here."""
