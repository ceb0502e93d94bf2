#!/usr/bin/env bash
# One node's share of a multi-node `agentrl train`: starts torchrun with this node's rank.
#
#   under Slurm (train_2nodes.sbatch runs it once per node with srun):
#     examples/multinode/node.sh env=calculator prompts_per_step=64 output_dir=/shared/runs/calc
#   by hand, on each machine (the same command, its own NODE_RANK):
#     NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 examples/multinode/node.sh env=calculator ...
#     NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 examples/multinode/node.sh env=calculator ...
#
# Every argument goes to `agentrl train`. Settings, Slurm's first when it set them:
#   NNODES          nodes in the job                 (SLURM_NNODES)
#   NODE_RANK       this node's index, 0 is the main (SLURM_NODEID)
#   MASTER_ADDR     address of node 0                (first host of SLURM_JOB_NODELIST)
#   MASTER_PORT     a free TCP port on node 0        (default 29500)
#   NPROC_PER_NODE  processes on this node           (default: the GPUs nvidia-smi lists, else 1)
#   PYTHON          the interpreter with agentrl     (default: python3)
# output_dir must be on a file system every node sees (rank 0 writes; every rank reads on resume).
set -euo pipefail

NNODES="${SLURM_NNODES:-${NNODES:-1}}"
NODE_RANK="${SLURM_NODEID:-${NODE_RANK:-0}}"
if [[ -n "${SLURM_JOB_NODELIST:-}" ]] && command -v scontrol >/dev/null; then
  MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
fi
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the address of node 0, or run under Slurm}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
  NPROC_PER_NODE="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  [[ "$NPROC_PER_NODE" -gt 0 ]] || NPROC_PER_NODE=1
fi

echo "node $NODE_RANK of $NNODES: $NPROC_PER_NODE process(es), rendezvous at $MASTER_ADDR:$MASTER_PORT" >&2
exec "${PYTHON:-python3}" -m torch.distributed.run \
  --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  -m agentrl train "$@"
