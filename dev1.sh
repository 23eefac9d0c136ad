source .tvm-device/boot.sh > /dev/null 2>&1 && pip install -q -e . --no-deps > /dev/null 2>&1
mkdir -p $OUT/x/bert
OUT=$OUT/x timeout 120 python benchmarks/probes/copy_rule.py > $OUT/x/copy.log 2>&1
echo "rc=$?" >> $OUT/x/copy.log
grep "^|" $OUT/x/copy.log
timeout 200 python benchmarks/bert_model.py --out $OUT/x/bert --dtypes float16 --no-compile > $OUT/x/bert.log 2>&1
echo "bert rc=$?" >> $OUT/x/bert.log
grep -E "row: tvm_ext|row: torch CUDA|all 14|transpose" $OUT/x/bert.log | head
timeout 170 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gru_tensor_core.py -k "b64-h1024-nw4 or b5-h200-bi-kw4-frag or b3-h33-3layer-bi-nw4 or without_a_config" > $OUT/x/t.log 2>&1
echo "t rc=$?" >> $OUT/x/t.log
tail -3 $OUT/x/t.log
