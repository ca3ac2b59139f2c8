"""A Horovod Spark estimator script, written the way Horovod's docs and its
``examples/spark/pytorch/pytorch_spark_mnist.py`` write it, with only ``horovod`` -> ``kolo``
in the imports.

scikit-learn's bundled digits (8x8 images, no download) are written as a libsvm file with
``dump_svmlight_file`` and read back with ``spark.read.format('libsvm')``, so ``features`` is
a column of sparse vectors, as in Horovod's MNIST example. The labels are one-hot encoded with
``OneHotEncoder``, the store is ``Store.create(work_dir)``, the ranks start through
``SparkBackend(num_proc=2)``, the features are reshaped with ``input_shapes=[[-1, 1, 8, 8]]``
for a small CNN, and the loss is a lambda. ``fit`` trains, ``transform`` predicts the held-out
DataFrame, and ``MulticlassClassificationEvaluator`` prints the test accuracy.

Run it (after ``dev/setup.sh``)::

    .venv/bin/python examples/spark_horovod_docs_style.py --num-proc 2
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import pyspark.sql.types as T
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from pyspark import SparkConf
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import OneHotEncoder
from pyspark.sql import SparkSession
from pyspark.sql.functions import udf
from sklearn.datasets import dump_svmlight_file, load_digits

import kolo.spark.torch as hvd
from kolo.spark.common.backend import SparkBackend
from kolo.spark.common.store import Store

parser = argparse.ArgumentParser(
    description="PyTorch Spark digits example (Horovod docs style)",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
)
parser.add_argument("--master", help="spark master to connect to")
parser.add_argument(
    "--num-proc",
    type=int,
    default=2,
    help="number of worker processes for training",
)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size for training")
parser.add_argument("--epochs", type=int, default=12, help="number of epochs to train")
parser.add_argument(
    "--work-dir",
    default=None,
    help="working directory for intermediate files (default: a temporary directory)",
)


def write_digits_libsvm(path):
    """Writes scikit-learn's digits (pixels scaled to [0, 1]) as a 1-based libsvm file."""
    digits = load_digits()
    dump_svmlight_file(digits.data / 16.0, digits.target, path, zero_based=False)


def train_and_evaluate(spark, work_dir, num_proc=2, batch_size=32, epochs=12):
    """Horovod's MNIST estimator flow on the digits; returns the test accuracy."""
    # Setup our store for intermediate data
    store = Store.create(work_dir)

    # Load dataset into a Spark DataFrame
    libsvm_path = os.path.join(work_dir, "digits.libsvm")
    write_digits_libsvm(libsvm_path)
    df = spark.read.format("libsvm").option("numFeatures", "64").load(libsvm_path)

    # One-hot encode labels into SparseVectors
    encoder = OneHotEncoder(inputCols=["label"], outputCols=["label_vec"], dropLast=False)
    model = encoder.fit(df)
    train_df = model.transform(df)

    # Train/test split
    train_df, test_df = train_df.randomSplit([0.9, 0.1], seed=1)

    # Define the PyTorch model without any Horovod-specific parameters
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
            self.fc1 = nn.Linear(128, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, features):
            x = features.float()
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2(x), 2))
            x = x.view(-1, 128)
            x = F.relu(self.fc1(x))
            x = self.fc2(x)
            return F.log_softmax(x, dim=1)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = nn.NLLLoss()

    # Train a kolo Spark Estimator on the DataFrame
    backend = SparkBackend(
        num_proc=num_proc,
        stdout=sys.stdout,
        stderr=sys.stderr,
        prefix_output_with_timestamp=True,
    )
    torch_estimator = hvd.TorchEstimator(
        backend=backend,
        store=store,
        model=model,
        optimizer=optimizer,
        loss=lambda input, target: loss(input, target.long()),
        input_shapes=[[-1, 1, 8, 8]],
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=batch_size,
        epochs=epochs,
        validation=0.1,
        verbose=1,
    )

    torch_model = torch_estimator.fit(train_df).setOutputCols(["label_prob"])

    # Evaluate the model on the held-out test DataFrame
    pred_df = torch_model.transform(test_df)

    argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
    pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
    evaluator = MulticlassClassificationEvaluator(
        predictionCol="label_pred", labelCol="label", metricName="accuracy"
    )
    return evaluator.evaluate(pred_df)


if __name__ == "__main__":
    args = parser.parse_args()

    # Initialize SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = SparkConf().setAppName("pytorch_spark_digits").set("spark.sql.shuffle.partitions", "2")
    if args.master:
        conf.setMaster(args.master)
    elif args.num_proc:
        conf.setMaster(f"local[{args.num_proc}]")
    spark = SparkSession.builder.config(conf=conf).getOrCreate()

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="kolo-docs-style-")
    print(
        "Test accuracy:",
        train_and_evaluate(spark, work_dir, args.num_proc, args.batch_size, args.epochs),
    )

    spark.stop()
