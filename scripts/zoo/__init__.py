"""The model corpus of scripts/model_zoo.py: real architectures through the exporters their
users use, checked against onnxruntime (see docs/model-zoo.md).

``catalog`` lists the models and the exporters (importable in every environment: it needs
nothing but the standard library); ``export_*`` modules export them, each run by the Python
of the environment its exporter needs; ``check`` builds and runs them with relaxweb.
"""
