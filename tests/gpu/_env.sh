# Sourced by tests/gpu/run_*_on_device.sh: results go under $OUT (default ./gpu-out), and the CUDA
# toolkit's bin folder joins PATH (GPU machines often have nvcc, ncu and compute-sanitizer off PATH).
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH
