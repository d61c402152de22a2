"""`python -m longctx.report`, the same as `python -m longctx report` (`longctx.commands.report`)."""

from longctx.commands.report import main

if __name__ == "__main__":
    main()
