"""`python -m longctx.context`, the same as `python -m longctx context` (`longctx.commands.context`)."""

from longctx.commands.context import main

if __name__ == "__main__":
    main()
