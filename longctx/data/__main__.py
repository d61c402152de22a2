"""`python -m longctx.data prepare|synth ...`: a corpus's token cache, a synthetic task
(`longctx.commands.data`)."""

from longctx.commands.data import main

if __name__ == "__main__":
    main()
