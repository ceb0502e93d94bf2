"""``python -m agentrl ...``: what launchers run (``accelerate launch -m agentrl train ...``, ``torchrun -m agentrl train ...``)."""

from agentrl.cli import main

raise SystemExit(main())
