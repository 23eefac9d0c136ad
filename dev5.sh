source .tvm-device/boot.sh > /dev/null 2>&1 && pip install -q -e . --no-deps > /dev/null 2>&1
mkdir -p $OUT/x
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > $OUT/x/smi.txt
timeout 420 python benchmarks/gru_vendor.py --out $OUT/x/v --cases "fp16_B8_H512,bf16_B8_H512,fp16_B64_H1024,bf16_B64_H1024,fp16_B64_H1024_lengths" > $OUT/x/vendor.txt 2>&1
timeout 120 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gru_tensor_core.py -k "without_a_config" tests/test_gru_poll_pairs.py > $OUT/x/gpu_tests.txt 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv >> $OUT/x/smi.txt
