"""What every command and callback runs on, with no command of its own: one-line user errors
(`errors.py`), files written whole or not at all (`atomic.py`), the run directory's layout, lock and
ledger (`run_layout.py`, `run_lock.py`, `run_folder.py`), what a command line resolves to
(`config_digest.py`) and how a process that trained with others ends (`process_exit.py`). It imports
no command (`longctx.commands`) and no method."""
