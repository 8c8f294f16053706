# Chorus, CPU image. (A CUDA image with prebuilt FlashInfer kernels is described in docs/deploy.md.)
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 CHORUS_CACHE_DIR=/var/cache/chorus
RUN apt-get update && apt-get install -y --no-install-recommends libsndfile1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY server ./server
COPY web ./web
COPY bench ./bench
RUN pip install .
RUN useradd --create-home --uid 10001 chorus && mkdir -p /models /voices /var/cache/chorus \
    && chown chorus /voices /var/cache/chorus
USER chorus
VOLUME ["/models", "/voices"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
ENTRYPOINT ["chorus", "serve", "--host", "0.0.0.0", "--port", "8000", "--voices-dir", "/voices"]
