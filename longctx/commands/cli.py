"""`python -m longctx fit|validate|test --config X.yaml`: LightningCLI with longctx's conventions.

On top of LightningCLI it:
- links the vocabulary size from the data module into the model (`data.vocab_size`);
- gives every run its own directory `<trainer.default_root_dir>/<run_name>` (checkpoints, saved
  config, W&B files), where the run name is stable across SLURM requeues of the same array task;
  a `fit` into a folder that holds a run is refused unless it continues that run (`--ckpt_path
  last`, a SLURM requeue) or `--overwrite_run true` moves the old run aside (`longctx.runtime.run_folder`);
  a command refused before its work starts leaves no folder and no file behind;
- makes W&B safe to use anywhere: offline when no credentials and no `WANDB_MODE` are present (never
  an interactive login prompt), the W&B run id derived from the run name (so a requeued job resumes
  its W&B run), runs of one sweep grouped, and the full resolved config and git revision logged;
  W&B writes only into the run directory (`keep_wandb_in`), which must be writable (one line if not);
- saves in `config.yaml` what ran: the precision Lightning resolved (`16-mixed` runs as `bf16-mixed`
  on CPU), not the one asked for;
- builds the model from the config and the flags alone, also with `--ckpt_path` (LightningCLI 2.6
  would re-parse it from the checkpoint's saved hyperparameters, dropping evaluation settings such
  as TRAMS's), and refuses, in one line, a checkpoint whose weights do not fit that model;
- reports bad input in one line (`error: ...`, exit status 1; `longctx.runtime.errors`): config and flag
  typos, wrong types and class paths (the line of jsonargparse's message that names the problem, not
  the usage), YAML syntax errors (with the file and line), a model's or data module's `__init__`
  rejecting its settings, missing corpus files, a missing, truncated, unsafe or unfitting
  `--ckpt_path` file, `--ckpt_path last` with nothing to evaluate. `LONGCTX_DEBUG=1` keeps tracebacks.

`predict` is not offered: an LM's prediction here is its per-token NLL, which depends on the carried
memory and the method's scoring protocol; `test`/`validate` compute exactly that, token-weighted and
synced across ranks, while a predict loop would gather unreduced per-rank outputs with neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import netrc
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from pydoc import locate
from typing import Any, Literal

import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import (
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
    _get_module_type,
    _InstantiatorFn,
)
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from longctx.callbacks import (
    CheckpointOnSigterm,
    DivergenceError,
    ProgressLog,
    RunRecord,
    StopAtAccuracy,
    StopOnDivergence,
    recorded,
)
from longctx.callbacks.init_weights import InitWeights
from longctx.callbacks.run_record import run_record
from longctx.callbacks.sigterm import ctrl_c_exit_code
from longctx.callbacks.token_nll import TokenNLLWriter
from longctx.callbacks.vocabulary import RunVocabulary
from longctx.checkpoints.fit_check import check_checkpoint_fits
from longctx.checkpoints.saving import RUN_FILE_FIX, DiskFullError, use_atomic_checkpoints, write_whole
from longctx.commands import TRAINER_COMMANDS, load
from longctx.commands.parse_errors import OneLineParser
from longctx.core.base import LMBase
from longctx.core.data_facts import DataMismatch
from longctx.core.knob_groups import group_types
from longctx.data.datamodule import LMDataModule
from longctx.data.download import DataError
from longctx.runtime.atomic import unwritable_ancestor
from longctx.runtime.config_digest import config_digest
from longctx.runtime.errors import BadInput, ParseError, debug_enabled, exit_with_error
from longctx.runtime.run_folder import held_run, move_aside, undone_if_refused
from longctx.runtime.run_layout import CONFIG, WANDB, checkpoint_dir, run_directory
from longctx.runtime.run_lock import RunDirectoryBusy, holds_run_locks, lock_if_launching

WANDB_LOGGER = "lightning.pytorch.loggers.WandbLogger"
# `--ckpt_path` values Lightning resolves itself; anything else is a file.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")
FIT_STAGES = {"fit": TrainerFn.FITTING, "validate": TrainerFn.VALIDATING, "test": TrainerFn.TESTING}


class ConfigError(ValueError):
    """Bad input found by the CLI; `main` prints it as one line."""


@rank_zero_only
def say(message: str) -> None:
    """One line for the person reading the log (rank 0 only)."""
    print(f"longctx: {message}", file=sys.stderr, flush=True)


def run_name_from_env() -> str:
    """A run name that is unique per run and stable across SLURM requeues of the same task.

    `LONGCTX_RUN_NAME` wins; else the SLURM array job and task ids (or the job id); else a
    timestamp with the process id.
    """
    return stable_run_name_from_env() or time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def stable_run_name_from_env() -> str | None:
    """`LONGCTX_RUN_NAME`, else the SLURM array job and task ids (or the job id), else None: the
    names a restarted command gets again."""
    if name := os.environ.get("LONGCTX_RUN_NAME"):
        return name
    if (array_job := os.environ.get("SLURM_ARRAY_JOB_ID")) and (
        task := os.environ.get("SLURM_ARRAY_TASK_ID")
    ):
        return f"slurm-{array_job}_{task}"
    if job := os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{job}"
    return None


def wandb_credentials_present() -> bool:
    """Whether W&B can log in without asking: an API key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def ensure_wandb_mode() -> None:
    """Go offline when there is no W&B mode and no credentials (never prompt for a login)."""
    if not os.environ.get("WANDB_MODE"):
        os.environ.pop("WANDB_MODE", None)  # an empty value is no mode (wandb would reject it)
    if "WANDB_MODE" not in os.environ and not wandb_credentials_present():
        os.environ["WANDB_MODE"] = "offline"


def git_revision() -> str | None:
    """The source tree's commit (with `-dirty` if it has uncommitted changes), or None."""
    source = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("-dirty" if dirty else "")


# W&B's own folders outside its run files (wandb-core's logs, the artifact cache and staging area)
# default to the user's cache and data folders: a run keeps them in `<run_dir>/wandb/` instead.
WANDB_FOLDERS = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data", "WANDB_ARTIFACT_DIR": "artifacts"}
_wandb_folders_set: dict[str, str] = {}  # what keep_wandb_in set: a later run in-process moves it


def keep_wandb_in(run_dir: Path) -> None:
    """Point W&B's cache, data and artifact folders into the run directory, except those the user set,
    so W&B writes nothing outside the run directory (its run files go there through `dir`)."""
    for variable, name in WANDB_FOLDERS.items():
        value = os.environ.get(variable)
        if value is None or value == _wandb_folders_set.get(variable):
            os.environ[variable] = _wandb_folders_set[variable] = os.path.abspath(run_dir / WANDB / name)


def check_writable(run_dir: Path) -> None:
    """The run directory, or the folder it will be created in, must be writable: checkpoints, records
    and W&B's files go there (W&B would otherwise fall back to the system temp folder)."""
    if (blocked := unwritable_ancestor(run_dir)) is not None:
        raise ConfigError(
            f"run directory {run_dir} cannot be written ({blocked} is not a writable folder): set "
            "--trainer.default_root_dir to a folder you can write"
        )


# W&B run summaries keep the best value of these, not the last one.
MIN_SUMMARIES = ("val/loss", "val/bpc", "val/ppl", "val/word_ppl")


class LoggedConfigCallback(SaveConfigCallback):
    """Saves the resolved config in the run directory and logs it, with the git revision, to W&B,
    when the command's work starts (after its setup and checkpoint loading): a command refused
    while it sets up leaves the `config.yaml` of the run already in the folder as it was.

    `config.yaml` is written whole or not at all, replacing an earlier one (a requeued run writes
    into its own run directory again); a full disk is one line (`DiskFullError`), never a truncated
    file (jsonargparse's `save` writes in place)."""

    _config_path: Path | None = None

    def __init__(self, parser: LightningArgumentParser, config: Namespace, *args: Any, **kwargs: Any) -> None:
        """`recorded_config`: the config to save, when it differs from the one the trainer was built
        from (the CLI's, before it derived the run's folders from its name)."""
        recorded = kwargs.pop("recorded_config", None)
        super().__init__(parser, config if recorded is None else recorded, *args, **kwargs)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Record the settings the trainer resolved, with a warning at most: the precision (`16-mixed`
        runs as `bf16-mixed` on CPU, `null` as `32-true`) and a fit's epoch limit (`max_epochs: null`
        is 1000 epochs without `max_steps`, else unlimited). Accelerator, devices and strategy stay
        as given."""
        if "trainer" in self.config:
            self.config.trainer.precision = trainer.precision
            if stage == TrainerFn.FITTING:
                self.config.trainer.max_epochs = trainer.fit_loop.max_epochs
        self.stage = stage

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save_now(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._save_now(trainer, pl_module)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save_now(trainer, pl_module)

    def _save_now(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning's setup (ranks in step, W&B logging) with the file left to `save_config`."""
        save_to_log_dir = self.save_to_log_dir
        if save_to_log_dir and not self.already_saved:
            self._config_path = Path(trainer.log_dir) / self.config_filename  # log_dir: on every rank
        self.save_to_log_dir = False
        try:
            super().setup(trainer, pl_module, self.stage)
        finally:
            self.save_to_log_dir = save_to_log_dir

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._config_path is not None:  # rank zero only, as Lightning calls this
            text = self.parser.dump(self.config, skip_none=False)
            write_whole(self._config_path, text.encode(), "the run's config", RUN_FILE_FIX)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                experiment = logger.experiment
                config = self.parser.dump(self.config, skip_none=False, format="json")
                experiment.config.update(
                    {"cli": config, "git_revision": git_revision(), "command": " ".join(sys.argv)},
                    allow_val_change=True,
                )
                for name in MIN_SUMMARIES:
                    experiment.define_metric(name, summary="min")


class LongCtxTrainer(Trainer):
    """Lightning's Trainer plus the evaluation sweeps the papers report.

    The methods add them (`longctx.commands.TRAINER_COMMANDS`, from their registry entries): one
    method per command (e.g. `evaluate_overlaps`), taking its target's parameters after the trainer,
    which LightningCLI reads as the subcommand's options."""


def trainer_command(target: str) -> Any:
    """The trainer method running `target` ("module:function", loaded at each call) with the trainer
    first; its signature and docstring are the target's."""
    function = load(target)

    @functools.wraps(function)
    def command(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        return load(target)(self, *args, **kwargs)

    return command


for _name, _target in TRAINER_COMMANDS.items():
    setattr(LongCtxTrainer, _name, trainer_command(_target))


class ReportInitErrors(_InstantiatorFn):
    """Lightning's instantiator (it records the config as the model's hyperparameters) that keeps the
    error an `__init__` raises: jsonargparse would bury it in "Does not validate against any of the
    Union subtypes" and a dump of every setting."""

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        try:
            return super().__call__(
                class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs
            )
        except (ValueError, TypeError, OSError) as err:  # bad settings or files: the user's to fix
            error: Exception = ConfigError(f"{self.key}: {class_type.__name__}: {err}")
            error.__cause__ = err
        except Exception as err:  # a bug: keep its own traceback
            error = err
        self.cli.init_error = self.cli.init_error or error
        raise error


class ReportGroupErrors:
    """jsonargparse's instantiator for everything the model and data instantiators do not take, which
    keeps the error a knob group's `__post_init__` raises (`longctx.core.knob_groups`; e.g.
    `SpanTransformer.Config`), named by the group's place in the config: the group is built before
    its module, and jsonargparse would bury the error as it buries the module's (`ReportInitErrors`)."""

    def __init__(self, cli: LongCtxCLI) -> None:
        self.cli = cli

    def __call__(self, class_type: type, *args: Any, **kwargs: Any) -> Any:
        if not dataclasses.is_dataclass(class_type):
            return class_type(*args, **kwargs)
        try:
            return class_type(*args, **kwargs)
        except (ValueError, TypeError) as err:  # bad settings: the user's to fix
            error = ConfigError(f"{self.group_path(class_type)}: {class_type.__name__}: {err}")
            error.__cause__ = err
        self.cli.init_error = self.cli.init_error or error
        raise error

    def group_path(self, class_type: type) -> str:
        """Where the group of this class is in the config (`model.init_args.network`), found through
        the parsed model class; `model` when that is not known (only models take knob groups)."""
        config = getattr(self.cli, "config", None)
        subcommand = getattr(self.cli, "subcommand", None)
        if isinstance(config, Namespace) and subcommand:
            config = config.get(subcommand)
        class_path = config.get("model.class_path") if isinstance(config, Namespace) else None
        if not isinstance(class_path, str):
            return "model"
        model_class = locate(class_path)
        if not isinstance(model_class, type):
            return "model"
        names = [key for key, (group, _) in group_types(model_class.__init__).items() if group is class_type]
        return f"model.init_args.{names[0]}" if len(names) == 1 else "model"


class LongCtxCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.init_error: Exception | None = None
        self.resume_reason = "--ckpt_path last"  # what `last` resumes for, in its one line
        # The command line, recorded in summary.json (the sweep runner skips a line only if it matches).
        self.command = [str(arg) for arg in sys.argv[1:]] if kwargs.get("args") is None else kwargs["args"]
        kwargs.setdefault("save_config_callback", LoggedConfigCallback)
        # A requeued run writes into its own run directory again.
        kwargs.setdefault("save_config_kwargs", {"overwrite": True, "config_filename": CONFIG})
        kwargs.setdefault("trainer_class", LongCtxTrainer)
        kwargs.setdefault("parser_class", OneLineParser)  # parse errors as one line (parse_errors.py)
        # Appended to the config's trainer.callbacks (LightningCLI._instantiate_trainer).
        callbacks = [CheckpointOnSigterm(), RunRecord(), RunVocabulary()]
        kwargs.setdefault("trainer_defaults", {"callbacks": callbacks})
        super().__init__(LMBase, LMDataModule, *args, subclass_mode_model=True, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """fit, validate, test and the methods' commands (`predict` is not offered: see the module doc)."""
        commands = {name: args for name, args in LightningCLI.subcommands().items() if name != "predict"}
        return {**commands, **{name: {"model", "datamodule"} for name in TRAINER_COMMANDS}}

    def _run_subcommand(self, subcommand: str) -> None:
        self._add_token_nll_writer(subcommand)
        self._add_init_weights(subcommand)
        run_dir = Path(self.trainer.default_root_dir)
        record = run_record(self.trainer)
        # Refused before its work starts: no trace in the folder. One live command per run directory;
        # summary.json in it however the work ends; Ctrl-C exits 130.
        with (
            undone_if_refused(run_dir, lambda: record is None or record.started)
            if holds_run_locks()
            else contextlib.nullcontext(),
            lock_if_launching(run_dir),
            recorded(self.trainer, subcommand, command=self.command, config_digest=self.config_digest),
            ctrl_c_exit_code(),
        ):
            super()._run_subcommand(subcommand)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        # What the command resolves to, before the CLI fills in the run directory, the precision that
        # ran or a drawn seed: recorded in summary.json for the sweep runner (longctx.runtime.config_digest).
        self.config_digest = config_digest(parser, self.config)

    def _add_token_nll_writer(self, subcommand: str) -> None:
        """`--write_token_nll true`: the evaluation writes `token_nll.npz` in the run directory."""
        if not self.config[subcommand].get("write_token_nll"):
            return
        if subcommand == "fit":
            raise ConfigError(
                "--write_token_nll applies to validate, test and evaluate_overlaps; after fit, run "
                "`python -m longctx test --config ... --ckpt_path ... --write_token_nll true`"
            )
        self.trainer.callbacks.append(TokenNLLWriter())

    def _add_init_weights(self, subcommand: str) -> None:
        """`--init_weights PATH`: a fresh fit starts from PATH's weights (`InitWeights`), checked to fit
        the model before anything runs."""
        path = self.config[subcommand].get("init_weights")
        if not path:
            return
        if subcommand != "fit":
            raise ConfigError(
                "--init_weights applies to fit (a fresh run starting from another checkpoint's weights); "
                f"to {subcommand} a checkpoint, pass it as --ckpt_path"
            )
        try:
            check_checkpoint_fits(path, self.model, strict=self.model.strict_loading)
        except ValueError as err:
            raise ConfigError(f"--init_weights: {err}") from err
        self.trainer.callbacks.append(InitWeights(path))

    def _set_seed(self) -> None:
        """LightningCLI's, with a seed numpy cannot take (`--seed_everything -1`) as one line."""
        try:
            super()._set_seed()
        except ValueError as err:
            raise ConfigError(f"seed_everything: {err}") from err

    def _parse_ckpt_path(self) -> None:
        """Keep the config and the flags: LightningCLI 2.6 re-parses the model with the hyperparameters
        saved in `--ckpt_path` over them, so evaluation settings (memory length, TRAMS, protocol)
        silently revert to training's and another method's checkpoint replaces the configured model.
        Whether the checkpoint's weights fit the model is checked before loading (`prepare_ckpt_path`).
        """

    def _add_instantiators(self) -> None:
        for key, cls, subclasses in (
            ("model", self._model_class, self.subclass_mode_model),
            ("data", self._datamodule_class, self.subclass_mode_data),
        ):
            self.parser.add_instantiator(
                ReportInitErrors(cli=self, key=key), _get_module_type(cls), subclasses=subclasses
            )
        self.parser.add_instantiator(ReportGroupErrors(cli=self), object, subclasses=True)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception:
            if self.init_error is not None:
                raise self.init_error from self.init_error.__cause__
            raise

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        use_atomic_checkpoints(trainer.strategy)  # never a partial checkpoint under its final name
        return trainer

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(ProgressLog, "progress")  # a callback of every run, configurable
        parser.add_lightning_class_args(StopOnDivergence, "divergence")  # NaN or exploded loss stops fit
        parser.add_lightning_class_args(StopAtAccuracy, "recall_stop")  # recall >= min_acc stops fit
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Name of the run directory under trainer.default_root_dir and of the W&B run "
            "(default: $LONGCTX_RUN_NAME, else the SLURM array job/task id, else a timestamp)",
        )
        parser.add_argument(
            "--write_token_nll",
            type=bool,
            default=False,
            help="validate/test/evaluate_overlaps: write every scored target's NLL and offset to "
            "<run dir>/token_nll.npz (evaluate_overlaps: token_nll_overlap{o}.npz)",
        )
        parser.add_argument(
            "--init_weights",
            type=str | None,
            default=None,
            help="fit: start from this checkpoint's weights only (a fresh optimizer, schedule and data "
            "stream), e.g. a curriculum stage from the previous stage's best.ckpt, or a fine-tune on "
            "another text; a fit that resumes (--ckpt_path) takes its own checkpoint instead",
        )
        parser.add_argument(
            "--overwrite_run",
            type=bool,
            default=False,
            help="fit: start a new run in a run directory that holds one; the old run's files move to "
            "<run dir>.old-<time it last wrote> (without it such a fit is refused, unless it continues "
            "the run: --ckpt_path last)",
        )
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="high",
            help="torch.set_float32_matmul_precision: 'high' lets float32 matmuls use TF32 on GPUs",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and ckpt_path not in SPECIAL_CKPT_PATHS and not Path(ckpt_path).is_file():
            raise ConfigError(f"--ckpt_path {ckpt_path}: no such checkpoint file")
        if ckpt_path == "last" and not (config.get("run_name") or stable_run_name_from_env()):
            raise ConfigError(
                "--ckpt_path last resumes the run of the same name, but this command names none (no "
                "--run_name, no $LONGCTX_RUN_NAME, no SLURM job id), so it would get a new timestamped "
                "folder with nothing to resume: add --run_name NAME, the run to resume (runs/NAME)"
            )
        if config.get("overwrite_run") and self.subcommand != "fit":
            raise ConfigError(
                f"--overwrite_run applies to fit (a new run in a folder that holds one); {self.subcommand} "
                "adds its results to the run directory and replaces only its own earlier ones"
            )
        check_trainer_settings(config.trainer)
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        run_name = config.get("run_name") or run_name_from_env()
        config.run_name = run_name
        check_not_inside_itself(config.trainer.default_root_dir, run_name)
        for logger in _logger_configs(config.trainer.logger):
            forget_another_runs_wandb_id(logger, run_name)
        # config.yaml records the command's settings and its run's name, not the folders and W&B ids
        # derived from the name below: read back (`--config runs/NAME/config.yaml`) it names the same
        # run, and under another --run_name it writes nothing into this one.
        self.save_config_kwargs["recorded_config"] = config.clone()
        run_dir = run_directory(config.trainer.default_root_dir, run_name)
        config.trainer.default_root_dir = str(run_dir)
        check_writable(run_dir)
        for logger in _logger_configs(config.trainer.logger):
            if logger.class_path == WANDB_LOGGER:
                ensure_wandb_mode()
                keep_wandb_in(run_dir)
                init = logger.init_args
                init.save_dir = str(run_dir)
                init.name = init.get("name") or run_name
                # The W&B id must be unique in the project and stable across requeues.
                init.id = init.get("id") or wandb_run_id(run_name)
                init.resume = init.get("resume") or "allow"
                if group := os.environ.get("LONGCTX_WANDB_GROUP") or os.environ.get("SLURM_ARRAY_JOB_ID"):
                    init.group = init.get("group") or group
        for callback in _callback_configs(config.trainer.callbacks):
            check_last_checkpoint(callback)
            saves_checkpoints = callback.class_path.endswith(("ModelCheckpoint", "RunCheckpoint"))
            if saves_checkpoints and not callback.init_args.get("dirpath"):
                callback.init_args.dirpath = str(checkpoint_dir(run_dir))
            elif saves_checkpoints and self.subcommand == "fit":
                check_not_another_runs_checkpoints(callback.init_args.dirpath, run_dir)

    def before_fit(self) -> None:
        _check_checkpoint_names(self.trainer)
        self.continue_a_requeued_run()
        if holds_run_locks():  # the launching process decides; DDP ranks it starts find it decided
            self.claim_run_directory()
        self.prepare_ckpt_path()

    def continue_a_requeued_run(self) -> None:
        """A requeued SLURM job (`fit` with no `--ckpt_path`: its requeue checkpoint `hpc_ckpt_N.ckpt`
        is there, or SLURM counts a restart) continues its run as `--ckpt_path last` does: from the
        newer of `checkpoints/last*.ckpt` (the one SLURM's SIGTERM after the requeue saved) and
        the requeue checkpoint (Lightning alone would take the older requeue checkpoint)."""
        arguments = self.config_init["fit"]
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        requeued = self.trainer._checkpoint_connector._hpc_resume_path is not None or restarts > 0
        if arguments.get("ckpt_path") is None and SLURMEnvironment.detect() and requeued:
            arguments.ckpt_path = "last"
            self.resume_reason = "SLURM requeue"

    def claim_run_directory(self) -> None:
        """A run directory holds one run: a `fit` into a folder that holds one must continue it
        (`--ckpt_path last` or `hpc`, or a checkpoint inside the folder), or move it aside with
        `--overwrite_run true`; anything else stops here, before any step, in one line."""
        arguments = self.config_init["fit"]
        run_dir = Path(self.trainer.default_root_dir)
        held = held_run(run_dir)
        if held is None:
            return
        ckpt_path = arguments.get("ckpt_path")
        inside = ckpt_path not in (None, *SPECIAL_CKPT_PATHS) and Path(ckpt_path).resolve().is_relative_to(
            run_dir.resolve()
        )
        if held.has_fit and (ckpt_path in ("last", "hpc") or inside):
            return
        if arguments.get("overwrite_run"):
            moved = move_aside(run_dir)
            say(f"--overwrite_run: the run that was in {run_dir} ({held.description}) moved to {moved}")
            return
        continue_it = "continue it with --ckpt_path last, " if held.has_fit else ""
        raise ConfigError(
            f"run directory {run_dir} holds a run ({held.description}): {continue_it}give this run "
            f"another --run_name, or start over there with --overwrite_run true (the old run's files "
            f"move to {run_dir}.old-<time it last wrote>)"
        )

    def before_validate(self) -> None:
        self.prepare_ckpt_path()

    def before_test(self) -> None:
        self.prepare_ckpt_path()

    def before_evaluate_overlaps(self) -> None:
        self.prepare_ckpt_path()

    def prepare_ckpt_path(self) -> None:
        """Check that `--ckpt_path` fits the configured model, before Lightning loads it.

        `last` resolves as Lightning resolves it (the newest `last*.ckpt` of the run's checkpoint
        callbacks), except that `fit` also considers the SLURM requeue checkpoint (`hpc_ckpt_N.ckpt`
        in the run directory, which Lightning's `last` ignores) and takes the newer. With none yet,
        `fit` starts fresh and says so in one line (what a requeued or restarted sweep task relies
        on), while an evaluation has nothing to evaluate: an error.
        """
        arguments = self.config_init[self.subcommand]
        ckpt_path = arguments.get("ckpt_path")
        reason = self.resume_reason
        if ckpt_path == "last":
            connector = self.trainer._checkpoint_connector
            stage = FIT_STAGES.get(self.subcommand, TrainerFn.TESTING)
            with warnings.catch_warnings():  # Lightning's own warning says less than the lines below
                warnings.simplefilter("ignore")
                found = connector._parse_ckpt_path(stage, "last", model_provided=True, model_connected=True)
            if self.subcommand == "fit":
                candidates = [path for path in (found, connector._hpc_resume_path) if path]
                found = max(candidates, key=os.path.getmtime, default=None)
            if found is None:
                where = checkpoint_dir(self.trainer.default_root_dir)
                if self.subcommand != "fit":
                    raise ConfigError(f"--ckpt_path last: no checkpoint in {where}, so nothing to evaluate")
                say(f"{reason}: no checkpoint in {where} yet; the run starts fresh")
                arguments.ckpt_path = None  # Lightning would warn again
                return
            say(f"{reason}: resuming from {found}")
            arguments.ckpt_path = ckpt_path = str(found)
        if ckpt_path and ckpt_path not in SPECIAL_CKPT_PATHS:
            try:
                check_checkpoint_fits(ckpt_path, self.model, strict=self.model.strict_loading)
            except ValueError as err:
                raise ConfigError(str(err)) from err


def wandb_run_id(run_name: str) -> str:
    """The W&B run id of a run: its name in the characters W&B allows."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_name)


def check_not_inside_itself(root: str | None, run_name: str) -> None:
    """A root that ends with the run's own name is that run's folder: a `config.yaml` written before
    runs recorded their root (`fit --config runs/NAME/config.yaml --run_name NAME`) would put the
    run's metrics in `runs/NAME/NAME` and its checkpoints in `runs/NAME`."""
    name = Path(run_name).parts
    if root and Path(root).parts[-len(name) :] == name and held_run(root) is not None:
        raise ConfigError(
            f"trainer.default_root_dir {root} is the folder of the run {run_name} itself, not the folder "
            f"runs are made in (a config.yaml saved by an older longctx names its run's folder): add "
            f"--trainer.default_root_dir {Path(root).parents[len(name) - 1]}"
        )


def check_not_another_runs_checkpoints(dirpath: str, run_dir: Path) -> None:
    """A fit's checkpoints never go into another run's folder (a `config.yaml` written before runs
    recorded their root names its run's `checkpoints/` as the callback's dirpath): they would replace
    that run's `last.ckpt`."""
    owner = Path(dirpath).parent
    if owner.resolve() != run_dir.resolve() and held_run(owner) is not None:
        raise ConfigError(
            f"trainer.callbacks: checkpoints would go into {dirpath}, the folder of another run ({owner}), "
            f"not this run's {checkpoint_dir(run_dir)} (a config.yaml saved by an older longctx names its "
            "run's folders): set the callback's dirpath to null"
        )


def forget_another_runs_wandb_id(logger: Namespace, run_name: str) -> None:
    """A W&B logger's name and id made for another run (`wandb_run_id` of its name, as a `config.yaml`
    written before runs recorded their root holds them) are dropped, so that this run gets its own:
    with them it would log into the other run's W&B history (W&B resumes a run by its id)."""
    if logger.class_path != WANDB_LOGGER:
        return
    init = logger.init_args
    name, run_id = init.get("name"), init.get("id")
    if name and name != run_name and run_id == wandb_run_id(name):
        init.name = init.id = None


def _logger_configs(logger: Any) -> list[Namespace]:
    if isinstance(logger, Namespace):
        return [logger]
    if isinstance(logger, list):
        return [item for item in logger if isinstance(item, Namespace)]
    return []


def _callback_configs(callbacks: Any) -> list[Namespace]:
    return [item for item in callbacks or [] if isinstance(item, Namespace)]


LIGHTNING_MODEL_CHECKPOINTS = {
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
    "pytorch_lightning.callbacks.ModelCheckpoint",
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
}


def check_last_checkpoint(callback: Namespace) -> None:
    """Lightning's own `ModelCheckpoint` with `save_last` is refused: its `last.ckpt` falls behind
    the run once the monitored metric stops improving, and `--ckpt_path last` or a test of it would
    silently use an older model (`longctx.callbacks.checkpoint`)."""
    if callback.class_path in LIGHTNING_MODEL_CHECKPOINTS and callback.init_args.get("save_last"):
        raise ConfigError(
            "trainer.callbacks: Lightning's ModelCheckpoint with save_last writes last.ckpt only when it "
            "saves a top-k checkpoint, so last.ckpt falls behind once the monitored metric stops "
            "improving; use longctx.callbacks.RunCheckpoint (the same arguments)"
        )


# Trainer counts Lightning divides by, and what each one counts.
TRAINER_COUNTS = {
    "val_check_interval": "the training steps between two validations (an int >= 1), or the fraction "
    "of an epoch between them (a float in (0, 1])",
    "check_val_every_n_epoch": "the epochs between two validations (>= 1), or null to count steps "
    "(val_check_interval)",
    "accumulate_grad_batches": "the batches whose gradients make one optimizer step (>= 1; 1 "
    "accumulates nothing)",
}


def check_trainer_settings(trainer: Namespace) -> None:
    """Trainer settings Lightning takes without a word and then fails on, refused before anything
    runs: a count it divides by (a zero was a ZeroDivisionError at the first step), a negative
    clipping threshold (no clipping at all)."""
    for name, meaning in TRAINER_COUNTS.items():
        value = trainer.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ConfigError(f"trainer.{name} {value}: give {meaning}")
    clip = trainer.get("gradient_clip_val")
    if isinstance(clip, int | float) and clip < 0:
        raise ConfigError(
            f"trainer.gradient_clip_val {clip}: give the clipping threshold (> 0), or null to clip nothing "
            "(Lightning would skip clipping without a word)"
        )


def _check_checkpoint_names(trainer: Trainer) -> None:
    """Metric names like `val/bpc` in a checkpoint file name would create sub-directories."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint):
            name = callback.format_checkpoint_name({})
            if "/" in os.path.relpath(name, callback.dirpath or "."):
                raise ConfigError(
                    f"ModelCheckpoint filename {callback.filename!r} gives {name!r}, a path with "
                    "sub-directories made from metric names with '/': set auto_insert_metric_name: "
                    "false, e.g. filename: 'step{step}-val_loss{val/loss:.4f}'"
                )


PARSER_KWARGS = {"parser_mode": "yaml"}


class _ParserBuilt(Exception):
    def __init__(self, parser: LightningArgumentParser) -> None:
        self.parser = parser


def parser_only() -> LightningArgumentParser:
    """The CLI's parser with every subcommand, built without parsing or instantiating anything (for
    checking many command lines, e.g. `python -m longctx.sweep check`, with one parser)."""

    class Capture(LongCtxCLI):
        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            raise _ParserBuilt(parser)

    try:
        Capture(args=[], parser_kwargs=PARSER_KWARGS)
    except _ParserBuilt as built:
        return built.parser
    raise AssertionError("LightningCLI parsed no arguments")  # unreachable: parse_arguments raises


# Bad input (the user's to fix) as opposed to a bug: printed as one line by `main`.
# Lightning's MisconfigurationException is a setting it refuses (`trainer.limit_val_batches -1`).
USER_ERRORS = (
    BadInput,
    ConfigError,
    ParseError,
    DataError,
    DataMismatch,
    DiskFullError,
    RunDirectoryBusy,
    MisconfigurationException,
)


def main(args: list[str] | None = None) -> LongCtxCLI:
    """LightningCLI's commands (fit, validate, test, evaluate_overlaps; `longctx.commands` routes them
    here, for `python -m longctx` and the `longctx` script); bad input exits with one line."""
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["predict"]:
        sys.exit(
            "error: predict is not offered: per-token NLL depends on the carried memory and the scoring "
            "protocol, which `test` and `validate` apply; run one of those"
        )
    try:
        return LongCtxCLI(args=args, parser_kwargs=PARSER_KWARGS)
    except USER_ERRORS as err:
        if debug_enabled():
            raise
        exit_with_error(err)
    except DivergenceError as err:  # summary.json already says "diverged"
        if debug_enabled():
            raise
        say(str(err))
        sys.exit(1)
