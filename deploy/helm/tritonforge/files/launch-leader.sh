#!/bin/sh
# A multi-node group's leader (rank 0): wait until every worker of its group answers `kubectl exec`, write
# mpirun's hostfile (this pod first, so rank 0 lands here and serves the ports), then run the command given
# (`tritonforge serve ...`, whose mpirun reads the hostfile and the rsh agent from the environment).
# LeaderWorkerSet names a group's pods <leader>-1 ... <leader>-(size-1) and sets LWS_GROUP_SIZE.
set -eu
leader=$(hostname)
mkdir -p "$(dirname "$TRITONFORGE_MPI_HOSTFILE")"
echo "$leader slots=$TRITONFORGE_GPUS_PER_NODE" > "$TRITONFORGE_MPI_HOSTFILE"
index=1
while [ "$index" -lt "$LWS_GROUP_SIZE" ]; do
  worker="$leader-$index"
  until "$TRITONFORGE_KUBECTL" exec "$worker" -c tritonforge -- true >/dev/null 2>&1; do
    echo "waiting for worker $worker"
    sleep 2
  done
  echo "$worker slots=$TRITONFORGE_GPUS_PER_NODE" >> "$TRITONFORGE_MPI_HOSTFILE"
  index=$((index + 1))
done
echo "mpirun hosts:"; cat "$TRITONFORGE_MPI_HOSTFILE"
exec "$@"
