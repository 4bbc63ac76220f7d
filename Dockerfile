# rig's image: the CLI, the Celery worker, beat and Flower. See docker-compose.yml.
FROM python:3.11-slim

# NVIDIA_DRIVER_CAPABILITIES: the NVIDIA Container Toolkit mounts the driver's CUDA (compute)
# and NVML (utility) libraries. PCI_BUS_ID: CUDA numbers cards as NVML and nvidia-smi do.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    CUDA_DEVICE_ORDER=PCI_BUS_ID \
    RIG_HOME=/var/lib/rig

WORKDIR /opt/rig
COPY pyproject.toml README* ./
COPY rig ./rig
COPY workers ./workers
COPY config ./config
# rig and its jobs run as an unprivileged user, not root: the gpu-worker shares the host's pid
# namespace, where root could signal every process of the host. The uid is one no host user is
# likely to have (change it with --build-arg RIG_UID=...); the rig home (logs, Flower's
# credentials) belongs to it.
ARG RIG_UID=10001
RUN pip install . \
    && useradd --uid "$RIG_UID" --user-group --no-create-home --home-dir /var/lib/rig --shell /usr/sbin/nologin rig \
    && mkdir -p /var/lib/rig/logs \
    && chown -R rig:rig /var/lib/rig \
    && chmod 700 /var/lib/rig
USER rig

CMD ["rig", "--help"]
