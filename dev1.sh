source .tvm-device/boot.sh > /dev/null 2>&1 && pip install -q -e . --no-deps > /dev/null 2>&1
mkdir -p $OUT/x/bert
OUT=$OUT/x timeout 150 python benchmarks/probes/copy_rule.py > $OUT/x/copy.log 2>&1
echo "rc=$?" >> $OUT/x/copy.log
grep "^|" $OUT/x/copy.log
timeout 380 python benchmarks/bert_model.py --out $OUT/x/bert --dtypes float16 --no-compile > $OUT/x/bert.log 2>&1
echo "bert rc=$?" >> $OUT/x/bert.log
tail -40 $OUT/x/bert.log
