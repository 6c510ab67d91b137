"""Sharding strategies (distributed.strategy): DeepSpeed ZeRO 1/2/3 with offload, and FSDP.

deepspeed_json builds the DeepSpeed config from the run config; checks validates it with
DeepSpeed's own classes before launch; deepspeed_runtime and fsdp set a training process up;
guard verifies after the Trainer's setup that the model is wrapped as asked; fsdp_checkpoint
writes and reads an FSDP run's sharded checkpoints.
See docs/strategies.md.
"""
