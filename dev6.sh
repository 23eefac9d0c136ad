source .tvm-device/boot.sh > /dev/null 2>&1 && pip install -q -e . --no-deps > /dev/null 2>&1
mkdir -p $OUT/x
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > $OUT/x/smi.txt
TC="fuse_step=1,step_loop=2,step_barrier=2,step_tc=1,step_flags=1,step_tc_rows=16,step_tc_kw=4,step_tc_nw=1,step_tc_poll=16"
timeout 300 python benchmarks/probes/gru_step_knob.py --rounds 5 --cases 18,19,10 --variants "pick;tc8:$TC,step_j=8,step_tc_wreg=1,step_tc_acc=2;tc16:$TC,step_j=16,step_tc_wreg=1,step_tc_acc=2" > $OUT/x/probe.txt 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv >> $OUT/x/smi.txt
