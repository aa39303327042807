#!/bin/bash
# The device check from `cargo xtask device-bundle`'s binaries, for a GPU
# machine with no Rust toolchain and no registry: the CUDA parity suite (a
# skip fails), a model served over HTTP on cuda:0, then the figures of
# docs/cuda.md. Logs go to $OUT (or out/ beside this script).
cd "$(dirname "$0")"
OUT=${OUT:-$(pwd)/out}
mkdir -p "$OUT"
log=$OUT/check.log
exec > >(tee -a "$log") 2>&1
set -x
start=$(date +%s)
for f in *.xz; do xz -dkf -T0 "$f" 2>/dev/null || python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[1][:-3],'wb'))" "$f"; done
chmod +x sluice kernels-test write-model
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
lib=$(ls /usr/local/cuda/lib64/libnvrtc.so.1[0-9] /usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.1[0-9] 2>/dev/null | head -1)
if [ -z "$lib" ]; then
  lib=$(find /usr /opt -name 'libnvrtc.so.1[0-9]' 2>/dev/null | head -1)
fi
echo "NVRTC: $lib"
# This build opens NVRTC and cuBLAS by their CUDA 12 names; CUDA 13's have
# the functions sluice calls.
mkdir -p /tmp/nv
for f in "$(dirname "$lib")"/libnvrtc*; do ln -sf "$f" /tmp/nv/; done
ln -sf "$lib" /tmp/nv/libnvrtc.so.12
blas=$(find /usr /opt -name 'libcublas.so.1[0-9]' 2>/dev/null | head -1)
echo "cuBLAS: $blas"
if [ -n "$blas" ]; then
  for f in "$(dirname "$blas")"/libcublas*; do ln -sf "$f" /tmp/nv/; done
  ln -sf "$blas" /tmp/nv/libcublas.so.12
  lt=$(ls "$(dirname "$blas")"/libcublasLt.so.1[0-9] 2>/dev/null | head -1)
  [ -n "$lt" ] && ln -sf "$lt" /tmp/nv/libcublasLt.so.12
fi
ls -la /tmp/nv
export SLUICE_NVRTC=/tmp/nv LD_LIBRARY_PATH=/tmp/nv:$LD_LIBRARY_PATH SLUICE_REQUIRE_GPU=1
timeout 200 ./kernels-test cuda:: --test-threads 1 2>&1 | tee $OUT/parity.log | tail -60
echo "parity done at $(( $(date +%s) - start )) s"
bench() { timeout 100 ./sluice bench model --model "$@" --reps 2; }
./write-model llama-3.1-8b /tmp/8b.gguf 1 q4_k
echo "8b written at $(( $(date +%s) - start )) s"
bench /tmp/8b.gguf --device cuda:0 --prefill 2048 --decode 128 --batch 1
SLUICE_CUDA_GRAPHS=0 bench /tmp/8b.gguf --device cuda:0 --prefill 0 --decode 128 --batch 1
bench /tmp/8b.gguf --device cuda:0 --prefill 0 --decode 128 --batch 64
echo "8b benched at $(( $(date +%s) - start )) s"
rm -f /tmp/8b.gguf
./write-model llama-3.2-1b /tmp/1b.gguf 1 f16
./sluice serve -m /tmp/1b.gguf --device cuda:0 --port 8099 -np 4 > $OUT/serve.log 2>&1 &
pid=$!
for i in $(seq 90); do curl -sf localhost:8099/health && break; sleep 1; done
for p in "Hello world, this is a test" "The capital of France is"; do
  curl -s localhost:8099/completion -d "{\"prompt\":\"$p\",\"n_predict\":24,\"temperature\":0}" | head -c 1500; echo
done
kill $pid
tail -20 $OUT/serve.log
bench /tmp/1b.gguf --device cuda:0 --prefill 2048 --decode 128 --batch 1
SLUICE_CUBLAS=0 bench /tmp/1b.gguf --device cuda:0 --prefill 2048 --decode 0 --batch 1
echo "all done at $(( $(date +%s) - start )) s"
