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
RUN pip install . && mkdir -p /var/lib/rig/logs

CMD ["rig", "--help"]
