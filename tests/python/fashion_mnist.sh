# Sourced by the example tests: converts Debian's Fashion-MNIST
# (dataset-fashion-mnist) with the built gpufeed into
# $work/fashion-mnist-{train,t10k}.h5 unless they are there. Needs $cli, $work.
src=/usr/share/datasets/fashion-mnist
mkdir -p "$work"
for split in train t10k; do
  out="$work/fashion-mnist-$split.h5"
  [ -f "$out" ] || "$cli" convert "$src/$split-images-idx3-ubyte.gz" --labels "$src/$split-labels-idx1-ubyte.gz" \
                      -o "$out" >/dev/null
done
