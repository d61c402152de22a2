"""`python -m longctx.sweep run|check SWEEP_FILE ...`: the sweep runner (`longctx.commands.sweep`)."""

from longctx.commands.sweep import main
from longctx.runtime.errors import reported_as_one_line

if __name__ == "__main__":
    with reported_as_one_line(ValueError, OSError):  # a missing sweep file, a line that is no run
        main()
