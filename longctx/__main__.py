"""`python -m longctx fit|validate|test --config configs/X.yaml`."""

from longctx.cli import main

if __name__ == "__main__":
    main()
