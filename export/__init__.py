from appkit.logs import quiet_tensorflow_import

quiet_tensorflow_import()  # before any module of the package imports TensorFlow
