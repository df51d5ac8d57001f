"""Machines, the simulator and the real measurers: how long does a placement take?"""
