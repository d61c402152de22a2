# shellcheck shell=bash
# Shared environment of the sbatch scripts (sourced, not run).
# Runs in the repository root; activates its virtual environment if there is one.
if [[ ! -f pyproject.toml || ! -d longctx ]]; then
    echo "submit the sbatch scripts from the longctx repository root (cwd is $PWD)" >&2
    exit 2
fi
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi
mkdir -p slurm/logs
# Compute nodes often have no internet: W&B logs offline unless credentials are present (see
# longctx/commands/cli.py); `wandb sync runs/<run>/wandb/offline-run-*` uploads later from a login node.
export PYTHONUNBUFFERED=1
