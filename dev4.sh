source .tvm-device/boot.sh > /dev/null 2>&1 && pip install -q -e . --no-deps > /dev/null 2>&1
mkdir -p $OUT/x
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > $OUT/x/smi.txt
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gru_poll_pairs.py > $OUT/x/gpu_tests.txt 2>&1
timeout 360 python benchmarks/probes/gru_step_knob.py --rounds 5 --cases 0,1,4,5,3,2,17,16 --variants "pick;p16:step_tc_poll=16" > $OUT/x/probe.txt 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv >> $OUT/x/smi.txt
