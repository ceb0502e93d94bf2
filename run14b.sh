python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
R=$OUT/r; mkdir -p $R
python3 benchmarks/async_vs_dp.py --build --tokenizer .assets/qwen3 --model /tmp/q05 > $R/build.txt 2>&1
echo "built t=$SECONDS" >> $R/results.txt
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/gpu_vs_trl.py --worker sft --row /tmp/q05sft --model /tmp/q05 --sft-seconds 100 > $R/sft.log 2>&1; echo "sft rc=$? t=$SECONDS $(grep RESULT $R/sft.log | tail -1)" >> $R/results.txt) &
B="--model /tmp/q05 --steps 5 --generations 8 --tokens 256 --micro 16"
M="--model /tmp/q05sft --steps 5 --generations 8 --multiturn"
run() { name=$1; lim=$2; shift 2; left=$((575 - SECONDS)); [ $left -lt 45 ] && { echo "$name skipped (time)" >> $R/results.txt; return; }; [ $lim -gt $left ] && lim=$left; timeout $lim "$@" > $R/$name.log 2>&1; echo "$name rc=$? t=$SECONDS $(grep RESULT $R/$name.log | tail -1)" >> $R/results.txt; }
CUDA_VISIBLE_DEVICES=0 run sync8 110 python3 benchmarks/async_vs_dp.py --mode sync $B --prompts 8
wait
run dp16 100 torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode dp $B --prompts 16
run mtsync8 100 python3 benchmarks/async_vs_dp.py --mode sync $M --prompts 8
run mtdp8 100 torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode dp $M --prompts 8
run mtasync8 100 python3 benchmarks/async_vs_dp.py --mode async $M --prompts 8
run mtdp16 100 torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode dp $M --prompts 16
run dp8 100 torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode dp $B --prompts 8
cat $R/results.txt
for f in $R/*.log; do tail -c 3000 $f > $f.tail; rm $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
