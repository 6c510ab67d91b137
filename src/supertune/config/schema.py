"""The run config schema: one typed dataclass per section.

Every field has a default that works as-is and a docstring under it; those docstrings are what
`supertune train --help` and `supertune config keys` print (see `supertune.config.docs`). YAML is
only data: it is turned into these classes by `supertune.config.build`, which checks every type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from ..launch.launchers import launcher_names
from .choices import OneOf
from .objectives import objective_names

__all__ = [
    "ModelConfig",
    "LoraConfig",
    "DataConfig",
    "TrainingConfig",
    "GenerateConfig",
    "EvaluationConfig",
    "OutputConfig",
    "LaunchConfig",
    "SlurmConfig",
    "FsdpConfig",
    "DistributedConfig",
    "RunConfig",
]


@dataclass
class LoraConfig:
    """Low-rank adapters through peft; the base weights stay frozen."""

    enabled: bool = False
    """Train LoRA adapters instead of all weights."""
    r: int = 8
    """Adapter rank."""
    alpha: int = 16
    """Scaling numerator: the adapter output is multiplied by alpha / r."""
    dropout: float = 0.05
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names (suffixes) that get adapters, or ["all-linear"]."""
    merge_on_save: bool = False
    """Merge the adapters into the base weights when saving the final model (a plain model, no peft needed to load it)."""


@dataclass
class ModelConfig:
    """What model to train and how to load it."""

    name_or_path: str | None = None
    """Local model directory or hub id (used from the local HF cache only when offline); with model.lora.enabled, a directory of saved LoRA adapters trains them further on the base their adapter_config.json names. Empty: the embedded tiny Llama."""
    from_config: bool = False
    """Build the model from name_or_path's config with fresh random weights (pre-training) instead of loading weights."""
    config_overrides: dict[str, Any] = field(default_factory=dict)
    """Model config fields to change, e.g. {num_hidden_layers: 2} or "num_hidden_layers=2,hidden_size=64"; implies fresh weights when set with from_config."""
    tokenizer: str | None = None
    """Tokenizer directory or hub id; "train" builds a new one from the training files (cached by content hash). Empty: the model's own, or the embedded default."""
    tokenizer_vocab_size: int = 4096
    """Vocabulary size when model.tokenizer is "train"."""
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Weight dtype to load and to save the final model in."""
    low_cpu_mem_usage: bool = True
    """Load weights straight into place without a random copy first. transformers 5 always loads this way; false is refused there."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    """Attention kernel; empty lets transformers choose."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: about 30% more compute for much less memory."""
    gradient_checkpointing_every: int = 1
    """With gradient_checkpointing: checkpoint every Nth decoder layer (the 1st, N+1th, ...), keeping the others' activations; 1: all (full), 2: half the layers, half the recomputation."""
    trust_remote_code: bool = False
    """Allow model code from the model directory (needed by some hub models)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of name_or_path."""
    bundle: str | None = None
    """Token store made with `supertune prepare --bundle` whose offline bundle supplies the tokenizer and, with from_config, the model config: no hub access for either."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes batches."""

    train_files: list[str] = field(default_factory=list)
    """Training files: a path, a glob or a list of them (.txt, .json, .jsonl, .csv, .parquet). Empty with no dataset_name: the embedded corpus."""
    validation_files: list[str] = field(default_factory=list)
    """Validation files; empty: validation_split_percentage of the training data is held out."""
    dataset_name: str | None = None
    """Hub dataset name, read from the local HF datasets cache when offline."""
    dataset_config: str | None = None
    """Hub dataset configuration name."""
    validation_split: str = "auto"
    """Split of data.dataset_name to evaluate on: auto takes its validation split, else its test split, else holds out validation_split_percentage of train (the log says which); or a split name, e.g. test."""
    validation_split_percentage: int = 5
    """Percent of the training data held out for validation when no validation files (or dataset split) are given."""
    text_field: str = "text"
    """Column that holds the text (json, jsonl, csv, parquet and hub datasets)."""
    template: str | None = None
    """Prompt template applied to every document, with {text} (or any {column}) placeholders, e.g. "Write a document: {text}"."""
    format: Literal["text", "chat", "prompt_completion"] = "text"
    """Shape of a row: text (a document in text_field, or data.template's rendering), chat (a conversation of {role, content} turns in messages_field, rendered with the chat template), prompt_completion (prompt_field then completion_field). With no data files, chat trains on the embedded conversations."""
    messages_field: str = "messages"
    """Column that holds a conversation, a list of {role, content} (data.format=chat)."""
    prompt_field: str = "prompt"
    """Column that holds the prompt (data.format=prompt_completion; preference objectives, where it may be left out when the chosen and rejected conversations share their turns before the answer)."""
    completion_field: str = "completion"
    """Column that holds the answer to the prompt (data.format=prompt_completion; training.objective=kto)."""
    chosen_field: str = "chosen"
    """Column that holds the preferred answer of a preference pair (training.objective dpo, orpo, simpo): text, or a conversation ending on the answer turn."""
    rejected_field: str = "rejected"
    """Column that holds the dispreferred answer of a preference pair, in the form of chosen_field."""
    label_field: str = "label"
    """Column that holds whether a completion is desirable, true or false (training.objective=kto)."""
    prompt_template: str | None = None
    """data.format=prompt_completion: the prompt written from the row's columns instead of read from prompt_field, e.g. "Write a document: " or "Summarise {title}: " (literal braces as {{ }})."""
    completion_template: str | None = None
    """data.format=prompt_completion: the answer written from the row's columns instead of read from completion_field, e.g. "{text}" (with it, plain documents and the embedded stories become prompt/answer rows)."""
    chat_template: str | None = None
    """Jinja chat-template file that renders the conversations (data.format=chat); empty: the tokenizer's own (the embedded tokenizer's built-in one for the embedded default). The final model saves the template with its tokenizer."""
    loss_on: Literal["all", "completion", "assistant"] | None = None
    """Tokens the loss is computed on; the others get label -100: all, completion (the answer of a prompt/completion row), assistant (every assistant turn of a conversation). Empty: all for text, completion for prompt_completion, assistant for chat."""
    streaming: bool = False
    """Read the data lazily as an iterable stream (needs training.max_steps)."""
    packing: bool = True
    """Concatenate documents with EOS between them and cut into block_size blocks; false: pad or truncate each document to max_length."""
    block_size: int = 128
    """Tokens per training sequence when packing."""
    document_mask: bool = False
    """With packing, keep documents apart: whole documents per block (longer ones cut into block_size pieces), positions restarting per document, attention and loss never crossing a boundary. Costs the padding left in the blocks (logged) and a masked attention kernel: 0.93x plain packing's tokens/s on wikitext-2 at block 512 (bench/results/packing.md). Off by default: plain packing, where a document sees the end of the one before it, is the usual pre-training trade and keeps existing runs' data as it was. With a preference objective: pack each batch's pairs (KTO: rows) into rows of up to block_size tokens, chosen and rejected side by side and apart (docs/preference.md#packing); without it their sequences are padded."""
    max_length: int | None = None
    """Tokens per sequence in padding mode (pad or truncate); empty: the longest document, capped by the model's context."""
    add_eos: bool = True
    """Append the EOS token to every document."""
    shuffle_buffer: int = 10000
    """Buffer size of the approximate shuffle in streaming mode."""
    max_train_samples: int | None = None
    """Use at most this many training documents (quick experiments)."""
    max_eval_samples: int | None = None
    """Use at most this many validation documents."""
    sample: Literal["first", "shuffled"] = "first"
    """Which documents max_train_samples / max_eval_samples keep: the first N, or N drawn after a shuffle by training.seed (as dataset.shuffle(seed).select(range(N)))."""
    store: str | None = None
    """Token store directory made by `supertune prepare`: train on its memory-mapped token ids instead of reading and tokenizing the files."""
    store_check: Literal["auto", "sha256", "size"] = "auto"
    """How data.store is checked when training starts, in every process: sha256 reads every byte, size only compares file sizes; auto: sha256 up to 4 GiB, size above (check a copied big store once with supertune prepare --verify)."""

    @property
    def loss_target(self) -> str:
        """data.loss_on, or the default of data.format when it is empty."""
        return self.loss_on or _DEFAULT_LOSS_ON[self.format]

    @property
    def embedded(self) -> bool:
        """Whether no data is named (no files, dataset or token store): the embedded data stands in."""
        return not (self.train_files or self.dataset_name or self.store)


_DEFAULT_LOSS_ON = {"text": "all", "prompt_completion": "completion", "chat": "assistant"}


@dataclass
class TrainingConfig:
    """Optimisation and bookkeeping; names and meanings are those of transformers' TrainingArguments."""

    objective: Annotated[str, OneOf(objective_names)] = "sft"
    """What the loss is (docs/preference.md): sft (next-token prediction on the data, as data.format says), or preference tuning on {prompt, chosen, rejected} rows: dpo (with training.dpo_loss), orpo, simpo (no reference model); or on {prompt, completion, label} rows: kto. With no data files, the preference objectives train on the embedded preference pairs, 400 steps at learning rate 3e-3 where the config sets neither."""
    beta: float = 0.1
    """Preference objectives: dpo and kto, the strength of the pull towards the reference model (TRL's and LLaMA-Factory's beta); simpo, the reward scale (the paper uses 2 to 10); orpo, the weight of the odds-ratio term (the paper's lambda, TRL's beta)."""
    dpo_loss: Literal["sigmoid", "ipo", "hinge"] = "sigmoid"
    """training.objective=dpo: sigmoid (the DPO paper's), ipo (Azar et al. 2023, a squared loss towards the margin 1/(2 beta)) or hinge (SLiC's, max(0, 1 - beta x margin)); TRL's loss_type."""
    simpo_gamma: float = 0.5
    """training.objective=simpo: the target reward margin gamma by which the chosen answer should lead (TRL's and LLaMA-Factory's simpo_gamma)."""
    desirable_weight: float = 1.0
    """training.objective=kto: weight of the desirable (label true) answers' loss, the paper's lambda_D (TRL's desirable_weight)."""
    undesirable_weight: float = 1.0
    """training.objective=kto: weight of the undesirable (label false) answers' loss, the paper's lambda_U (TRL's undesirable_weight); keep lambda_D x desirable rows / (lambda_U x undesirable rows) between 1 and 4/3, as the paper advises."""
    max_steps: int = 120
    """Optimizer steps; -1 runs num_train_epochs instead. When both are given, max_steps wins."""
    num_train_epochs: float = 1.0
    """Epochs, used when max_steps is -1; given without max_steps, it sets max_steps to -1."""
    per_device_train_batch_size: int = 16
    """Sequences per process per forward pass."""
    per_device_eval_batch_size: int = 16
    """Sequences per process in evaluation."""
    gradient_accumulation_steps: int = 1
    """Forward passes per optimizer step; global batch = per_device_train_batch_size x processes x this."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all processes, the same at any process count: per_device_train_batch_size becomes the most per process, the largest batch not above it that divides global_batch_size / processes is used, and gradient_accumulation_steps makes up the rest (both written into the run's config.yaml). Empty: per_device x processes x accumulation."""
    learning_rate: float = 2e-3
    """Peak learning rate."""
    lr_scheduler_type: Literal[
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "reduce_lr_on_plateau",
        "cosine_with_min_lr",
        "warmup_stable_decay",
    ] = "cosine"
    """Learning-rate schedule after warmup."""
    warmup_steps: float = 10.0
    """Warmup: a number of steps, or a fraction of all steps when below 1."""
    weight_decay: float = 0.0
    """Decoupled weight decay of AdamW."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm; 0 disables clipping."""
    optim: str = "adamw_torch"
    """Optimizer name as transformers knows it; "adamw_torch_fused" is the fused kernel."""
    eval_strategy: Literal["no", "steps", "epoch"] = "no"
    """When to evaluate during training (a final evaluation always runs)."""
    eval_steps: int | None = None
    """Steps between evaluations with eval_strategy steps."""
    save_strategy: Literal["no", "steps", "epoch", "best"] = "steps"
    """When to write checkpoints."""
    save_steps: int = 100
    """Steps between checkpoints with save_strategy steps."""
    save_total_limit: int | None = 2
    """Keep the newest this many checkpoints (older ones deleted after each save; the one `latest` names never); empty: keep all."""
    logging_steps: int = 10
    """Steps between logged losses (console, metrics.jsonl, TensorBoard)."""
    seed: int = 42
    """Seed for model init, data order and dropout."""
    data_seed: int | None = None
    """Separate seed for data order; empty: seed."""
    full_determinism: bool = False
    """Deterministic kernels everywhere (slower)."""
    bf16: bool = False
    """bf16 mixed precision."""
    fp16: bool = False
    """fp16 mixed precision (GPU only)."""
    torch_compile: bool = False
    """Compile the whole model with torch.compile, as the Trainer does (training.speed's compile, per decoder layer, then stands aside)."""
    speed: Literal["auto", "plain"] = "auto"
    """auto: every exact speed-up this device and run allow (the start of the run names them, summary.json's speed records them); plain: the model's own code as the Trainer runs it, for debugging."""
    speed_skip: list[str] = field(default_factory=list)
    """Speed-ups auto leaves out, by name: chunked_cross_entropy (the loss without the full logits), fused_adamw (adamw_torch as one fused kernel), flex_document_mask (document-masked packing through flex attention), compile (the decoder layers compiled)."""
    float8: bool = False
    """Train the decoder layers' linear layers in float8 (torchao; not bit-exact, so never taken by auto): needs a GPU of compute capability >= 8.9 (H100/H200, Ada) and distributed.strategy ddp, without LoRA."""
    dataloader_num_workers: int = 0
    """Worker processes per data loader."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Metric sinks besides metrics.jsonl: any of "tensorboard", "wandb" (offline into <run dir>/wandb unless WANDB_MODE is set; `supertune sync` uploads), "mlflow"; [] for none."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI with report_to mlflow (http://host:5000, sqlite:///path/mlflow.db); empty: MLFLOW_TRACKING_URI, else a SQLite store in <run dir>/mlflow."""
    tracking_project: str | None = None
    """W&B project and MLflow experiment of the tracked run; empty: output.name (WANDB_PROJECT and MLFLOW_EXPERIMENT_NAME win when set). A federation sets its name for its sites' runs."""
    tracking_group: str | None = None
    """Tracked group of the run: W&B's run group, MLflow's tag supertune.group; the run is then named after output.name rather than its directory. A federation sets it for its sites' runs and its global series."""
    ddp_timeout: int = 1800
    """Seconds a collective may wait before the process group gives up."""
    init_optimizer_from: str | None = None
    """A checkpoint of an earlier run whose optimizer state (AdamW moments; not its weights, schedule or step) this run starts from: a federated site keeps its optimizer across rounds this way. ddp only."""


@dataclass
class GenerateConfig:
    """The sample printed at the end of a run and by `supertune generate`."""

    prompt: str = "Once there was a town called"
    """Prompt to continue; empty string: no sample."""
    max_new_tokens: int = 48
    """Tokens to generate."""
    do_sample: bool = True
    """Sample (true) or decode greedily (false)."""
    temperature: float = 0.8
    """Sampling temperature."""
    top_k: int = 50
    """Sample from the k most likely tokens."""
    seed: int = 0
    """Sampling seed."""


@dataclass
class EvaluationConfig:
    """Downstream benchmarks: lm-evaluation-harness tasks run on the model (docs/benchmarks.md)."""

    tasks: list[str] = field(default_factory=list)
    """Harness tasks run after training, scores into <run dir>/benchmarks.jsonl and .md, metrics.jsonl and the tracking sinks: supertune_corpus (the embedded offline task), a harness task or group (hellaswag, arc_easy; its data in the local Hugging Face datasets cache) or a task YAML file; []: none."""
    every_steps: int | None = None
    """Also run them every N optimizer steps during training, on the main process (parameters whole on it: distributed.strategy ddp, zero1 or zero2); empty: after training only."""
    limit: int | None = None
    """Documents per task, the first N (a quick look at a large task); empty: all."""
    batch_size: int = 16
    """Sequences per forward pass of the harness."""


@dataclass
class OutputConfig:
    """Where a run writes and what it keeps."""

    name: str = "supertune"
    """Run name: prefix of the run directory and job name."""
    runs_root: str = "runs"
    """Parent of run directories created as <name>-<timestamp>."""
    save_model: bool = True
    """Save the final model to <run dir>/model in Hugging Face format (safetensors)."""
    dtype: Literal["same", "fp16", "bf16", "fp32"] = "same"
    """Dtype of the saved full model's floating-point tensors (model/, a merged LoRA model, fresh base weights), cast tensor by tensor after training whatever the training precision (config.json says it); same: as trained (model.dtype). LoRA adapters keep their dtype."""
    progress_seconds: float = 30.0
    """Seconds between progress lines (step, loss, tokens/s, ETA) when the output is not a terminal, as in a job log; a terminal shows a progress bar instead."""


@dataclass
class LaunchConfig:
    """How many processes, and how they are started."""

    nproc: int = 1
    """Processes on this machine for `supertune train`; above 1 the run goes through torchrun (gloo on CPU, nccl on GPU)."""
    launcher: Annotated[str, OneOf(launcher_names)] = "torchrun"
    """How a SLURM job starts its processes (supertune.launch.launchers): torchrun (c10d rendezvous), accelerate launch, the deepspeed launcher, or srun alone (one task per process, no rendezvous server)."""
    cluster: str = "local"
    """Cluster profile (`supertune clusters list`): GPUs per node, modules, container, environment of the site."""
    nodes: int = 1
    """Nodes of a SLURM job."""
    gpus_per_node: int | None = None
    """GPUs (processes) per node; empty: the cluster profile's."""
    procs_per_node: int | None = None
    """Processes per node on nodes without GPUs (CPU training); empty: 1."""
    master_port: int | None = None
    """Rendezvous port; empty: derived from the SLURM job id, so jobs sharing a node never collide."""
    max_restarts: int = 0
    """torchrun: restart the processes of a node this many times after one fails; each restart resumes from the latest good checkpoint."""


@dataclass
class SlurmConfig:
    """The #SBATCH settings of a job; empty values fall back to the cluster profile."""

    time: str = "01:00:00"
    """Wall-clock limit (HH:MM:SS or D-HH:MM:SS)."""
    partition: str | None = None
    """Partition; empty: the cluster profile's."""
    account: str | None = None
    """Account (project) charged; empty: the cluster profile's."""
    qos: str | None = None
    """Quality of service; empty: the cluster profile's."""
    mem: str | None = None
    """Memory per node, e.g. 480G; empty: Slurm's default for the partition."""
    exclusive: bool = False
    """Ask for whole nodes."""
    extra_args: list[str] = field(default_factory=list)
    """More #SBATCH options, e.g. ["--constraint=a100", "--reservation=llm"]."""
    signal_lead: int = 300
    """Seconds before the time limit at which SLURM asks the run to checkpoint and stop (--signal=B:USR1@N; SLURM may send it up to a minute earlier). Allow for one step plus one checkpoint save."""
    max_restarts: int = 20
    """How often a job that stopped on a signal after its checkpoint requeues itself (scontrol requeue); 0: never."""
    preflight: bool = False
    """Run `supertune doctor --comm` as the job's first step, under the same launcher: every process checks its node and the interconnect is measured; the job stops before training when a check fails (report in the job log and preflight.json)."""
    preflight_gbps: float | None = None
    """With preflight: the least bus bandwidth in GB/s (1e9 bytes/s, as nccl-tests) of all_reduce and all_gather at the largest size; below it the job stops."""
    preflight_max_size: str = "1G"
    """With preflight: the largest message measured (sizes double from 1M), e.g. 256K on a CPU test cluster; 1G takes about a minute and 3 GB per process on CPU."""


@dataclass
class FsdpConfig:
    """Fully sharded data parallel settings (distributed.strategy fsdp)."""

    sharding: Literal["full", "shard_grad_op", "hybrid", "hybrid_zero2"] = "full"
    """What is sharded: everything (full), gradients and optimizer state (shard_grad_op), or full/zero2 within a node and replicated across nodes (hybrid, hybrid_zero2)."""
    auto_wrap: bool = True
    """Wrap each decoder layer as its own shard unit."""
    cpu_offload: bool = False
    """Keep sharded parameters in CPU memory between uses."""


@dataclass
class DistributedConfig:
    """How the model and optimizer are spread over processes."""

    strategy: Literal["ddp", "zero1", "zero2", "zero3", "fsdp"] = "ddp"
    """Data parallel (ddp), DeepSpeed ZeRO stage 1/2/3, or FSDP."""
    offload: Literal["none", "cpu", "nvme"] = "none"
    """ZeRO: where optimizer state (and with zero3, parameters) live between steps."""
    nvme_path: str | None = None
    """ZeRO with offload nvme: a fast local directory, e.g. /flash/$USER or /tmp."""
    deepspeed_config: str | None = None
    """Your own DeepSpeed config file (JSON or YAML) as the base of a zero strategy's: supertune fills in only what must agree with the run (batch sizes, accumulation, precision, clipping, ZeRO stage and offload) and refuses an explicit value that differs."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """Single DeepSpeed settings over the generated (or your) config, e.g. distributed.deepspeed.reduce_bucket_size=1e7; ZeRO option names go into zero_optimization, dotted names (zero_optimization.overlap_comm) into their section."""
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    """FSDP settings."""


@dataclass
class RunConfig:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Model and tokenizer."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation data."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Optimisation, evaluation, checkpoints, logging."""
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    """Generated sample."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Downstream benchmarks (lm-evaluation-harness)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Run directory."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Processes and launcher."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Sharding strategy."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """SLURM job settings."""
