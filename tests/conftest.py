pytest_plugins = ["tests.labplugin"]
