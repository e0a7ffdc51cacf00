set -x
mkdir -p $OUT/src
export JACOBI_RUNS=1 JACOBI_NITER=10
KERNELS_DUMP=$OUT/src timeout 120 .gpu/benches/kernels --bench > $OUT/bench.txt 2>&1
cp .gpu/../benches/kernels.rs /dev/null 2>/dev/null
cd $OUT/src
for f in jacobi-generated-0 jacobi-generated-3; do
  nvcc -arch=sm_90 -cubin -o $f.cubin $f.cu 2>&1 | tail -3
  cuobjdump -sass $f.cubin > $f.sass
  echo "$f: LDG $(grep -c LDG $f.sass) STG $(grep -c STG $f.sass) instr $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $f.sass)"
  nvcc -arch=sm_90 -cubin -Xptxas -v -o /dev/null $f.cu 2>&1 | grep -E "registers|spill" | head -4
done
cd - >/dev/null
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis"
timeout 200 ncu $S -k jacobi_step --launch-skip 10 --launch-count 1 .gpu/benches/kernels --bench > $OUT/ncu-tuned.txt 2>&1; echo "ncu tuned rc=$?"
timeout 200 ncu $S -k jacobi_step --launch-skip 60 --launch-count 1 .gpu/benches/kernels --bench > $OUT/ncu-gen8.txt 2>&1; echo "ncu gen8 rc=$?"
timeout 200 ncu $S -k jacobi_step --launch-skip 225 --launch-count 1 .gpu/benches/kernels --bench > $OUT/ncu-gen4.txt 2>&1; echo "ncu gen4 rc=$?"
for f in tuned gen8 gen4; do echo "== $f"; grep -E "Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Stall|Mem Busy|Max Bandwidth|Executed Instructions  " $OUT/ncu-$f.txt | head -30; done
