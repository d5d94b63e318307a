#!/bin/bash
C=/work/main/target/release/cairn
D=/work/main/bench/data
for cfg in "default|" "coarse1M|--chunker cdc:8K,32K,128K,1M" "coarse2M|--chunker cdc:8K,32K,128K,2M" "group4M|--group 4M" "coarse2M+g4M|--chunker cdc:8K,32K,128K,2M --group 4M"; do
  name=${cfg%%|*}; args=${cfg#*|}
  for inp in mem random; do
    f=$D/mem.core; [ $inp = random ] && f=$D/random.bin
    rm -rf /tmp/sz; $C init /tmp/sz >/dev/null 2>&1
    $C backup $f --repo /tmp/sz --name x -c zstd:3 -q $args
    echo "$name $inp $(du -sb /tmp/sz | cut -f1)"
  done
  # os pair dedup
  rm -rf /tmp/sz /tmp/sz2; $C init /tmp/sz >/dev/null 2>&1; $C init /tmp/sz2 >/dev/null 2>&1
  $C backup $D/os.img --repo /tmp/sz --name os -c zstd:3 -q $args; a=$(du -sb /tmp/sz | cut -f1)
  $C backup $D/os2.img --repo /tmp/sz --name os -c zstd:3 -q $args; b=$(du -sb /tmp/sz | cut -f1)
  $C backup $D/os2.img --repo /tmp/sz2 --name os -c zstd:3 -q $args; c=$(du -sb /tmp/sz2 | cut -f1)
  echo "$name os-pair after1 $a after2 $b alone2 $c saving $(python3 -c "print(round(100*(1-($b-$a)/$c),1))")"
done
