"""The corpus: which models, from which exporter, in which environment, checked at which
shapes.  Standard library only: every exporter environment imports this module.

A model's inputs are made from its ONNX graph inputs (their dtypes as the model declares
them) and the *logical* dims of the model entry: ``inputs`` gives an input's dims outright
(ints, logical names, or sums such as ``"past+seq"``); otherwise each dim the model annotates
is an int, or a name mapped through ``dim_names`` (the name as the exporter wrote it ->
the logical name; unmapped names are used as they are).  ``shapes`` gives the logical dims'
values, one dict per run; each dynamic dim takes at least two values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Environments --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """Where an exporter runs.  ``main`` is relaxweb's own environment (torch, transformers,
    onnx, onnxruntime: what the tests have); the others are virtual environments under
    .cache/model-zoo/ made by ``model_zoo.py setup`` with ``requirements`` from PyPI."""

    name: str
    requirements: tuple[str, ...]
    #: distributions whose versions docs/model-zoo.md records
    packages: tuple[str, ...]


ENVIRONMENTS = {
    "main": Environment("main", (), ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")),
    # torchvision does not import beside the local torch 2.13 CPU build of the main
    # environment; torch 2.14.1 and torchvision 0.29.1 are the pair pip takes from this
    # machine's disk (a CUDA build; run on the CPU).  ultralytics needs torchvision.
    "torch": Environment(
        "torch",
        ("torch==2.14.1", "torchvision==0.29.1", "ultralytics", "optimum-onnx", "onnxruntime", "onnxscript"),
        ("torch", "torchvision", "ultralytics", "optimum", "optimum-onnx", "transformers", "onnx", "onnxruntime"),
    ),
    # jax2tf writes plain TF ops (which tf2onnx converts) only with native_serialization=False,
    # which jax 0.5 and later ignore (their XlaCallModule op has no ONNX conversion).
    "tf": Environment("tf", ("tensorflow-cpu", "tf2onnx", "jax[cpu]==0.4.38"),
                      ("tensorflow-cpu", "keras", "tf2onnx", "jax", "jaxlib", "onnx")),
    "paddle": Environment("paddle", ("paddlepaddle", "paddle2onnx", "onnxruntime"),
                          ("paddlepaddle", "paddle2onnx", "onnx")),
}


@dataclass(frozen=True)
class Exporter:
    key: str
    label: str
    environment: str


EXPORTERS = {e.key: e for e in [
    Exporter("torch-legacy", "torch.onnx.export (TorchScript, dynamo=False)", "main"),
    Exporter("torch-dynamo", "torch.onnx.export (torch.export, dynamo=True)", "main"),
    Exporter("torchvision-legacy", "torchvision model, torch.onnx.export (TorchScript)", "torch"),
    Exporter("torchvision-dynamo", "torchvision model, torch.onnx.export (torch.export)", "torch"),
    Exporter("ultralytics", "ultralytics YOLO.export(format='onnx', dynamic=True)", "torch"),
    Exporter("optimum", "optimum main_export from a save_pretrained folder", "torch"),
    Exporter("tf2onnx", "Keras application, tf2onnx.convert.from_function", "tf"),
    Exporter("jax2tf", "JAX, jax2tf.convert + tf2onnx", "tf"),
    Exporter("paddle2onnx", "paddle.onnx.export (paddle2onnx)", "paddle"),
    Exporter("ort-optimizer", "onnxruntime.transformers.optimizer.optimize_model (contrib ops)", "main"),
    Exporter("ort-float16", "onnxruntime.transformers float16 conversion", "main"),
]}

# Models --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    name: str
    category: str
    architecture: str
    exporter: str
    #: "module:function" under scripts/zoo, run in the exporter's environment: ``function(work)``
    #: exports into the folder ``work`` and returns {role: path of an .onnx file}
    export: str
    shapes: tuple[dict, ...]
    role: str = "model"
    inputs: dict = field(default_factory=dict)
    dim_names: dict = field(default_factory=dict)
    #: integer inputs (token ids) are drawn from [0, vocab)
    vocab: int = 100
    #: checked by tests/e2e/test_model_zoo.py (CI): passes today and needs only the main
    #: environment, or its file is committed under tests/data/model-zoo (< 1 MB)
    fast: bool = False
    committed: bool = False
    note: str = ""

    @property
    def group(self) -> str:
        """Models written by the same export function (an encoder and its decoder)."""
        return self.export

    @property
    def environment(self) -> str:
        return EXPORTERS[self.exporter].environment


def _sizes(name: str, *values: int, **fixed: int) -> tuple[dict, ...]:
    return tuple({name: value, **fixed} for value in values)


# Shapes shared by families of models.
IMAGES = ({"batch": 1, "height": 64, "width": 64}, {"batch": 2, "height": 96, "width": 64},
          {"batch": 3, "height": 64, "width": 128})
IMAGES_ODD = ({"batch": 1, "height": 64, "width": 64}, {"batch": 2, "height": 72, "width": 56},
              {"batch": 1, "height": 45, "width": 67})
TOKENS = ({"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}, {"batch": 3, "seq": 1})
DECODER_WITH_PAST = ({"batch": 1, "seq": 1, "past": 4}, {"batch": 2, "seq": 3, "past": 7},
                     {"batch": 2, "seq": 1, "past": 1})
OPTIMUM_DIMS = {"batch_size": "batch", "sequence_length": "seq", "past_sequence_length": "past",
                "past_sequence_length + sequence_length": "past+seq", "past_sequence_length + 1": "past+seq",
                "encoder_sequence_length": "enc", "encoder_sequence_length_out": "enc",
                "decoder_sequence_length": "seq", "num_channels": 3, "height": "height", "width": "width",
                "feature_size": "mel", "encoder_sequence_length / 2": "enc"}
KERAS_IMAGE = {"input": ["batch", "height", "width", 3]}

MODELS = [
    # Image classification ---------------------------------------------------------------
    Model("hf_resnet", "classification", "ResNet (transformers ResNetForImageClassification)", "torch-legacy",
          "export_torch:hf_resnet", IMAGES_ODD, fast=True),
    Model("hf_convnext", "classification", "ConvNeXt (transformers ConvNextForImageClassification)",
          "torch-dynamo", "export_torch:hf_convnext", IMAGES),
    Model("hf_vit", "classification", "ViT (transformers ViTForImageClassification, 32x32, patch 8)",
          "torch-legacy", "export_torch:hf_vit", _sizes("batch", 1, 3)),
    Model("hf_mobilenet_v2", "classification", "MobileNetV2 (transformers, depth multiplier 0.35)",
          "torch-legacy", "export_torch:hf_mobilenet_v2", IMAGES),
    Model("hf_efficientnet", "classification", "EfficientNet (transformers EfficientNetForImageClassification)",
          "torch-dynamo", "export_torch:hf_efficientnet", IMAGES),
    Model("tv_resnet18", "classification", "ResNet-18 (torchvision)", "torchvision-legacy",
          "export_torchvision:resnet18", IMAGES_ODD),
    Model("tv_mobilenet_v3_small", "classification", "MobileNetV3-Small (torchvision)", "torchvision-legacy",
          "export_torchvision:mobilenet_v3_small", IMAGES),
    Model("tv_efficientnet_b0", "classification", "EfficientNet-B0 (torchvision)", "torchvision-dynamo",
          "export_torchvision:efficientnet_b0", IMAGES),
    Model("tv_shufflenet_v2", "classification", "ShuffleNetV2 x0.5 (torchvision)", "torchvision-legacy",
          "export_torchvision:shufflenet_v2", IMAGES),
    Model("tv_convnext_tiny", "classification", "ConvNeXt-Tiny (torchvision)", "torchvision-dynamo",
          "export_torchvision:convnext_tiny", _sizes("batch", 1, 2, height=64, width=64)),
    Model("keras_mobilenet_v3_small", "classification", "MobileNetV3Small (keras.applications)", "tf2onnx",
          "export_keras:mobilenet_v3_small", IMAGES, inputs=KERAS_IMAGE),
    Model("keras_efficientnet_b0", "classification", "EfficientNetB0 (keras.applications)", "tf2onnx",
          "export_keras:efficientnet_b0", IMAGES, inputs=KERAS_IMAGE),
    Model("keras_resnet50", "classification", "ResNet50 (keras.applications)", "tf2onnx",
          "export_keras:resnet50", ({"batch": 1, "height": 64, "width": 64}, {"batch": 2, "height": 96, "width": 80}), inputs=KERAS_IMAGE),
    Model("keras_mobilenet_v2", "classification", "MobileNetV2 alpha 0.35 (keras.applications)", "tf2onnx",
          "export_keras:mobilenet_v2", IMAGES, inputs=KERAS_IMAGE),
    Model("keras_small_cnn", "classification", "a small Keras CNN (Conv2D, BatchNorm, pooling, Dense)", "tf2onnx",
          "export_keras:small_cnn", IMAGES_ODD, inputs=KERAS_IMAGE, committed=True),
    Model("paddle_mobilenet_v3_small", "classification", "MobileNetV3-Small (paddle.vision)", "paddle2onnx",
          "export_paddle:mobilenet_v3_small", IMAGES, inputs={"x": ["batch", 3, "height", "width"]}),
    Model("paddle_resnet18", "classification", "ResNet-18 (paddle.vision)", "paddle2onnx",
          "export_paddle:resnet18", IMAGES_ODD, inputs={"x": ["batch", 3, "height", "width"]}),
    Model("jax_byte_classifier", "classification",
          "a file-type classifier over bytes (JAX: embedding, conv1d, dense; Magika-like)", "jax2tf",
          "export_jax:byte_classifier", _sizes("batch", 1, 4), inputs={"bytes": ["batch", 512]}, vocab=256,
          committed=True),
    Model("resnet_fp16", "classification", "the ResNet above converted to float16 (inputs and weights)",
          "ort-float16", "export_ort:resnet_fp16", IMAGES_ODD),
    # Detection ---------------------------------------------------------------------------
    Model("yolov8n", "detection", "YOLOv8n from yolov8n.yaml (random weights)", "ultralytics",
          "export_yolo:yolov8n", IMAGES, inputs={"images": ["batch", 3, "height", "width"]}),
    Model("yolo11n", "detection", "YOLO11n from yolo11n.yaml (random weights)", "ultralytics",
          "export_yolo:yolo11n", IMAGES, inputs={"images": ["batch", 3, "height", "width"]}),
    Model("tv_retinanet_fpn", "detection",
          "RetinaNet backbone + FPN + heads (torchvision, ResNet-18 FPN, no box decoding)", "torchvision-legacy",
          "export_torchvision:retinanet_fpn", IMAGES),
    # Segmentation ------------------------------------------------------------------------
    Model("tv_deeplabv3", "segmentation", "DeepLabV3 MobileNetV3-Large (torchvision)", "torchvision-legacy",
          "export_torchvision:deeplabv3", IMAGES),
    Model("hf_segformer", "segmentation", "SegFormer (transformers SegformerForSemanticSegmentation)",
          "torch-legacy", "export_torch:hf_segformer", IMAGES),
    Model("unet", "segmentation", "U-Net (4 levels, transposed-conv upsampling, skip concats)", "torch-dynamo",
          "export_torch:unet", IMAGES),
    Model("paddle_dbnet", "segmentation", "DB text detector (PaddleOCR-style: backbone, FPN, upsampling head)",
          "paddle2onnx", "export_paddle:dbnet", IMAGES, inputs={"x": ["batch", 3, "height", "width"]}),
    # OCR --------------------------------------------------------------------------------
    Model("crnn_bilstm", "ocr", "CRNN (conv stack, 2-layer BiLSTM, CTC logits)", "torch-legacy",
          "export_torch:crnn_bilstm", ({"width": 64, "batch": 2}, {"width": 96, "batch": 1}, {"width": 160, "batch": 3}),
          inputs={"image": ["batch", 1, 32, "width"]}),
    Model("paddle_crnn_bilstm", "ocr", "PaddleOCR-style recognizer (conv, BiLSTM, CTC head)", "paddle2onnx",
          "export_paddle:crnn_bilstm", ({"width": 64, "batch": 2}, {"width": 96, "batch": 1}, {"width": 160, "batch": 3}),
          inputs={"x": ["batch", 3, 32, "width"]}),
    # Speech -----------------------------------------------------------------------------
    Model("kws_gru", "speech", "keyword spotter: 2-layer GRU over MFCC frames", "torch-legacy",
          "export_torch:kws_gru", ({"frames": 20, "batch": 2}, {"frames": 49, "batch": 1})),
    Model("vad_lstm", "speech", "voice-activity detector: LSTM with its state as inputs/outputs (Silero-like)",
          "torch-legacy", "export_torch:vad_lstm", ({"frames": 1, "batch": 2}, {"frames": 16, "batch": 1})),
    Model("wav2vec2", "speech", "wav2vec 2.0 CTC (transformers Wav2Vec2ForCTC)", "torch-legacy",
          "export_torch:wav2vec2", ({"samples": 1600, "batch": 2}, {"samples": 2400, "batch": 1})),
    Model("whisper_encoder", "speech", "Whisper encoder (optimum, tiny config)", "optimum", "export_optimum:whisper",
          _sizes("batch", 1, 2), role="encoder", inputs={"input_features": ["batch", 80, 3000]},
          note="3000 mel frames, as the config fixes them"),
    Model("whisper_decoder", "speech", "Whisper decoder (optimum, tiny config)", "optimum", "export_optimum:whisper",
          ({"batch": 1, "seq": 3, "enc": 1500}, {"batch": 2, "seq": 5, "enc": 700}), role="decoder",
          dim_names=OPTIMUM_DIMS),
    # Text -------------------------------------------------------------------------------
    Model("bert", "text", "BERT sequence classifier (transformers)", "torch-legacy", "export_torch:bert", TOKENS,
          fast=True),
    Model("distilbert", "text", "DistilBERT sequence classifier (transformers)", "torch-dynamo",
          "export_torch:distilbert", TOKENS),
    Model("gpt2", "text", "GPT-2 LM head (transformers)", "torch-legacy", "export_torch:gpt2", TOKENS, fast=True),
    Model("llama", "text", "Llama decoder, no cache (transformers LlamaForCausalLM)", "torch-legacy",
          "export_torch:llama", TOKENS),
    Model("optimum_bert", "text", "BERT feature extraction (optimum)", "optimum", "export_optimum:bert", TOKENS,
          dim_names=OPTIMUM_DIMS),
    Model("optimum_distilbert", "text", "DistilBERT text classification (optimum)", "optimum",
          "export_optimum:distilbert", TOKENS, dim_names=OPTIMUM_DIMS),
    Model("optimum_gpt2_kv", "text", "GPT-2 with KV cache (optimum text-generation-with-past)", "optimum",
          "export_optimum:gpt2", DECODER_WITH_PAST, dim_names=OPTIMUM_DIMS),
    Model("optimum_llama_kv", "text", "Llama decoder with KV cache (optimum text-generation-with-past)",
          "optimum", "export_optimum:llama", DECODER_WITH_PAST, dim_names=OPTIMUM_DIMS),
    Model("t5_encoder", "text", "T5 encoder (optimum text2text-generation)", "optimum", "export_optimum:t5",
          ({"batch": 1, "enc": 8}, {"batch": 2, "enc": 5}, {"batch": 3, "enc": 1}), role="encoder",
          dim_names=OPTIMUM_DIMS),
    Model("t5_decoder", "text", "T5 decoder (optimum text2text-generation)", "optimum", "export_optimum:t5",
          ({"batch": 1, "seq": 2, "enc": 8}, {"batch": 2, "seq": 5, "enc": 3}), role="decoder",
          dim_names=OPTIMUM_DIMS),
    Model("bert_ort_optimized", "text", "the BERT above through the transformer optimizer", "ort-optimizer",
          "export_ort:bert_optimized", TOKENS),
    Model("gpt2_ort_optimized", "text", "the GPT-2 above through the transformer optimizer", "ort-optimizer",
          "export_ort:gpt2_optimized", TOKENS),
    Model("bert_ort_fp16", "text", "the optimized BERT converted to float16 (float32 inputs and outputs)",
          "ort-float16", "export_ort:bert_fp16", TOKENS),
]

MODELS_BY_NAME = {model.name: model for model in MODELS}
