"""`python -m longctx fit|validate|test --config configs/X.yaml`; `python -m longctx convert ...` turns a
released checkpoint into a longctx one (`longctx.checkpoints.convert`); `python -m longctx report RUN_DIR...`
tables and plots finished runs (`longctx.report`); `python -m longctx context --config C --ckpt_path P ...`
sweeps the context a checkpoint may use (`longctx.context`)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"]:
        from longctx.checkpoints.convert import main as convert_main

        convert_main(sys.argv[2:])
    elif sys.argv[1:2] == ["context"]:
        from longctx.context import main as context_main

        context_main(sys.argv[2:])
    elif sys.argv[1:2] == ["report"]:
        from longctx.report import main as report_main

        report_main(sys.argv[2:])
    else:
        from longctx.cli import main

        main()
