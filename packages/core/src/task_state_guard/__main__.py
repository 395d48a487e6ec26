"""``python -m task_state_guard``: the CLI."""

from .cli import main

raise SystemExit(main())
