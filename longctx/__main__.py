"""`python -m longctx fit|validate|test --config configs/X.yaml`; `python -m longctx convert ...` turns a
released checkpoint into a longctx one (`longctx.convert`)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"]:
        from longctx.convert import main as convert_main

        convert_main(sys.argv[2:])
    else:
        from longctx.cli import main

        main()
