"""The observer's past lightcone: crossings, flat and HEALPix sky maps, Born convergence."""

from distpm.lightcone.config import LightconeConfig, SourceDistribution
from distpm.lightcone.run import LightconeObserver, lightcone

__all__ = ["LightconeConfig", "LightconeObserver", "SourceDistribution", "lightcone"]
