# esqbe with both engine clients; `esqbe serve` by default (docs/serving.md).
#   docker build -t esqbe .
#   docker run -p 127.0.0.1:8000:8000 -v "$PWD/esqbe-index:/data/esqbe-index" -e ESQBE_TOKEN esqbe
# Listening on 0.0.0.0 inside the container, the server refuses to start without ESQBE_TOKEN.
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md cli.py ./
COPY esqbe ./esqbe
COPY mappings ./mappings
COPY samples ./samples
RUN pip install --no-cache-dir '.[elasticsearch,opensearch]'
ENV HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false ESQBE_INDEX_PATH=/data/esqbe-index
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=30 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health').status != 200)"
ENTRYPOINT ["esqbe"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
