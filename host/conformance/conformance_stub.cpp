// placeholder until this component lands
