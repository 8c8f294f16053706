# syntax=docker/dockerfile:1.7
# Chorus server image.
#   GPU (default): docker build -t chorus .
#   CPU:           docker build --build-arg VARIANT=cpu -t chorus:cpu .
# Run: see docs/deploy.md. The model folder and the voice library are volumes.
ARG VARIANT=cuda
ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

# ---- what both variants install: the package, its pins, the page, the benchmarks ------------
FROM scratch AS sources
COPY pyproject.toml README.md requirements.lock /app/
COPY server /app/server
COPY web /app/web
COPY bench /app/bench

# ---- GPU: install from the pins, then build FlashInfer's kernels into the image -----------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build-cuda
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
        libsndfile1 ninja-build git && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY --from=sources /app /app
RUN pip install -c requirements.lock ".[gpu,postgres,tn]"
# nvcc compiles Chorus's kernels now, so the first request never waits on it. A layer of its own,
# with CUDA_ARCHS declared only here, so a build for other GPUs reuses the installed packages.
ARG CUDA_ARCHS="9.0a"
RUN FLASHINFER_CUDA_ARCH_LIST="${CUDA_ARCHS}" python -m server.engine.kernels.flashinfer_aot

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime-cuda
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3 libsndfile1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-cuda /opt/venv /opt/venv
COPY --from=build-cuda /app /app
ENV CHORUS_DEVICE=cuda FLASHINFER_DISABLE_JIT=1

# ---- CPU: the same pins, torch's CPU build -------------------------------------------------
FROM python:3.11-slim AS runtime-cpu
ENV PIP_NO_CACHE_DIR=1
# gcc and libc6-dev: one of the tn extra's packages (cdifflib, under nemo-text-processing) is C source only
RUN apt-get update && apt-get install -y --no-install-recommends libsndfile1 gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY --from=sources /app /app
RUN grep -v '^nvidia-\|^triton=\|^cuda-' requirements.lock > /tmp/cpu.lock \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.14.1+cpu" \
    && pip install -c /tmp/cpu.lock ".[postgres,tn]"
ENV CHORUS_DEVICE=cpu

# ---- the image -------------------------------------------------------------------------------
# A stage above, picked by VARIANT: no registry image, so no tag to pin.
# hadolint ignore=DL3006
FROM runtime-${VARIANT}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 CHORUS_CACHE_DIR=/var/cache/chorus \
    CHORUS_HOST=0.0.0.0 CHORUS_PORT=8000 CHORUS_VOICES_DIR=/voices HF_HOME=/models/.hf
WORKDIR /app
RUN groupadd --gid 10001 chorus && useradd --create-home --uid 10001 --gid 10001 chorus \
    && mkdir -p /models /voices /var/cache/chorus && chown chorus:chorus /voices /var/cache/chorus /models
# By number: Kubernetes can verify runAsNonRoot only for a numeric user.
USER 10001:10001
# normalize_text's English grammars (NeMo's) compiled now, into $CHORUS_CACHE_DIR, not at the first request
RUN python -m server.text.normalize_nemo
VOLUME ["/models", "/voices"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["chorus", "serve"]
