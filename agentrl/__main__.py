"""``python -m agentrl ...``: what launchers run (``accelerate launch -m agentrl train ...``, ``torchrun -m agentrl train ...``)."""

from agentrl.cli.main import main

if __name__ == "__main__":  # importing the module (tests, tools) must not run the CLI
    raise SystemExit(main())
