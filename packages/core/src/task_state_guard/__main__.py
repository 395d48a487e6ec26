"""``python -m task_state_guard``: the CLI."""

from .cli.commands import main

raise SystemExit(main())
