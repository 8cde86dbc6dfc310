#!/usr/bin/env bash
# Makes the fat-binary fixtures of this directory with nvcc (run once, on a
# box with the CUDA toolkit; no GPU needed) and records what cuobjdump lists
# in each. Usage: tests/data/fatbin/make.sh OUTDIR
# Every fixture is a stripped shared library of one tiny kernel, linked
# without the CUDA runtime (-cudart none: the registration calls stay
# undefined, which a shared library allows), so each is a few KiB.
set -uo pipefail
out=${1:?usage: make.sh OUTDIR}
mkdir -p "$out"
cd "$out"
cat > k.cu <<'CU'
__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }
extern "C" void launch(float *x) { scale<<<1, 32>>>(x, 2.0f); }
CU
printf 'int host_only(int x) { return x + 1; }\n' > host.c
nvcc --version > nvcc-version.txt
so() {  # so NAME [nvcc flags...]: one fixture
  local name=$1; shift
  if nvcc -shared -Xcompiler -fPIC -cudart none "$@" k.cu -o "$name.so" 2> "$name.err"; then
    strip "$name.so"
    rm -f "$name.err"
  else
    echo "FAILED: $name $*" >> failed.txt
  fi
}
g() { echo "-gencode=arch=compute_$1,code=$2"; }
# several cubins and a PTX, the toolkit's default compression
so multi $(g 80 sm_80) $(g 86 sm_86) $(g 90 sm_90) $(g 90a sm_90a) $(g 90 compute_90)
# PTX only
so ptx_only $(g 80 compute_80)
# arch-specific (a) and family (f) variants, Blackwell cubins (the newer ELF flags layout)
so variants $(g 90a sm_90a) $(g 100a sm_100a) $(g 100f sm_100f) $(g 120f sm_120f) $(g 121a sm_121a) $(g 90a compute_90a)
so blackwell $(g 100 sm_100) $(g 120 sm_120) $(g 120 compute_120)
# compression: none, each mode nvcc offers, and PTX compressed too
so uncompressed --compress-mode=none $(g 80 sm_80) $(g 80 compute_80)
so speed --compress-mode=speed $(g 80 sm_80) $(g 80 compute_80)
so size --compress-mode=size $(g 80 sm_80) $(g 80 compute_80)
so balance --compress-mode=balance $(g 80 sm_80) $(g 80 compute_80)
so compress_all -Xfatbin=-compress-all $(g 80 sm_80) $(g 80 compute_80)
# the same built the way the CUDA fixture's setup.py builds 8.0+PTX
so torch_80_ptx $(g 80 sm_80) $(g 80 compute_80)
# relocatable device code: an object with __nv_relfatbin
nvcc -c -rdc=true -Xcompiler -fPIC $(g 90 sm_90) k.cu -o rdc.o 2> rdc.err && rm -f rdc.err
# no device code at all
gcc -shared -fPIC host.c -o host_only.so && strip host_only.so
for f in *.so *.o; do
  [ -f "$f" ] || continue
  { echo "== $f"; echo "-- list-elf"; cuobjdump --list-elf "$f" 2>&1; echo "-- list-ptx"; cuobjdump --list-ptx "$f" 2>&1; } >> cuobjdump.txt
  { echo "== $f"; cuobjdump --dump-elf "$f" 2>&1 | grep -iE 'flags|abi|arch|ELF file' | head -40; cuobjdump --dump-ptx "$f" 2>&1 | grep -E '^\.(target|version)|arch =|code version' | head -20; } >> headers.txt
done
ls -l > sizes.txt
