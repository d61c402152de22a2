"""`python -m longctx COMMAND ...`: the commands of `longctx.commands` (fit, validate, test,
evaluate_overlaps, convert, report, context), the same as the installed `longctx` script."""

from longctx.commands import main

if __name__ == "__main__":
    main()
