"""The devices TensorFlow sees in this process, for the device budget
(`tflms.budget` asks through the lister this package registers)."""


def local_devices():
    """`DeviceAttributes` of every local device (name, device_type,
    memory_limit). Imported when asked: listing devices initialises the GPU
    runtime."""
    from tensorflow.python.client import device_lib  # pylint: disable=import-outside-toplevel
    return device_lib.list_local_devices()
