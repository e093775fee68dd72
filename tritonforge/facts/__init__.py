"""The facts every layer shares: the tensor contract, the model parameters, the engine limits, the error
kinds, the ports, the environment variables, the pinned release and the settings' declarations. Nothing here
imports the rest of tritonforge."""
