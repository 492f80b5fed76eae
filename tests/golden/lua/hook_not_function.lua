-- prune is a number here
return { prune = 5 }
