from toolshim.addon import ToolShim  # the package addon/toolshim/; this script is what mitmproxy loads
addons = [ToolShim()]
