#!/bin/sh
# mpirun's rsh agent: "kubexec.sh HOST COMMAND..." runs COMMAND in the serving container of the pod named by
# HOST's first label (a hostfile entry), as NVIDIA's EKS guide launches its ranks, without SSH.
host=$1
shift
exec "$TRITONFORGE_KUBECTL" exec -i "${host%%.*}" -c tritonforge -- /bin/sh -c "$*"
