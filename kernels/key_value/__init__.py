"""The KEY_VALUE kernel: a device cache over a host store over a disk store; rows carry optimizer state."""
